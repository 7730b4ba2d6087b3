"""No secret is written anywhere a run writes: a real `validate` on the test bed with known secrets.

The SSH private key, the hub token and the registry password come from the environment, as users give
them, and the models stage makes a one-time token for its peer exchange; the run uses each (SSH to every
node with the key, the token on every hub request, the password in every pull's registry auth, the
exchange token on every peer transfer). Then everything the run wrote is searched for them: every file in the runs
store (records, logs, reports, bench output), Prefect's result storage (persisted results and cache
records), and from the Prefect API the flow runs' parameters and state messages, every log line, every
artifact and every variable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from prefect import get_client
from prefect.client.schemas.filters import LogFilter

from k3deploy.core.paths import runs_dir
from k3deploy.flows.validate import validate
from k3deploy.localhub import HubServer, publish
from k3deploy.tasks.models import steps
from tests.bedconfig import write_config
from tests.checkpoints import checkpoint_files
from tests.launchbed import launch_data

pytestmark = [
    pytest.mark.faults,
    pytest.mark.e2e,
    pytest.mark.testbed,
    pytest.mark.prefect,
    pytest.mark.usefixtures("runs_dir"),
]
REPO = "k3test/secrets"


PAGE = 200  # the API's page size


def every(read: Callable[[int], list[Any]]) -> list[Any]:
    """All pages of an API listing."""
    out: list[Any] = []
    while page := read(len(out)):
        out += page
    return out


def key_lines(path: Path) -> list[str]:
    """The private key's base64 body lines: any of them written anywhere is a leak."""
    return [line for line in path.read_text().splitlines() if line and not line.startswith("-----")]


def test_a_validate_run_writes_no_secret_anywhere(prefect_server, testbed, bed_nodes, tmp_path, monkeypatch):
    token, password = f"hf_{uuid4().hex}", f"registry-{uuid4().hex}"
    exchange_tokens: list[str] = []  # the models stage's peer-exchange token, made by the real generator, watched
    make_token = steps.new_token
    monkeypatch.setattr(steps, "new_token", lambda: exchange_tokens.append(make_token()) or exchange_tokens[-1])
    secrets = [token, password, *key_lines(Path(testbed.key))]
    monkeypatch.setenv("K3DEPLOY_SSH_PRIVATE_KEY", Path(testbed.key).read_text())
    monkeypatch.setenv("K3DEPLOY_HUB_TOKEN", token)
    monkeypatch.setenv("K3DEPLOY_REGISTRY_PASSWORD", password)
    with HubServer(tmp_path / "hub", host=testbed.state.bridge["ip"]) as hub:
        publish(hub.root, REPO, checkpoint_files(3))
        data = launch_data(
            testbed, models__hub="huggingface", models__hub_endpoint=hub.url, models__target={"repo": REPO}
        )
        del data["cluster"]["ssh"]["private_key_file"]  # the key comes from the environment only
        registry = testbed.image_ref_by_digest.split("/")[0]
        data["image"]["registry"] = {"url": registry, "username": "k3deploy"}
        config = write_config(tmp_path / "site.yaml", data)
        assert not any(s in Path(config).read_text() for s in secrets)
        state = validate(config=config, only=["preflight", "models", "image", "launch", "smoke"], return_state=True)
        assert state.is_completed(), state.message
        assert any(r.authorized for r in hub.requests)  # the token was used
    assert len(exchange_tokens) == 1  # the checkpoint was striped over the nodes, with a token of the run's
    secrets.append(exchange_tokens[0])
    run_id = state.state_details.flow_run_id
    for transport_cleanup in bed_nodes["transports"].values():
        transport_cleanup.run(f"rm -rf /srv/models/{REPO.split('/')[1]}", 60)

    written = {p: p.read_bytes() for root in (runs_dir(), prefect_server) for p in Path(root).rglob("*") if p.is_file()}
    assert any(p.name == "record.json" for p in written) and any("report" in p.name for p in written)
    with get_client(sync_client=True) as client:
        runs = every(lambda offset: client.read_flow_runs(limit=PAGE, offset=offset))
        logs = every(lambda offset: client.read_logs(log_filter=LogFilter(), limit=PAGE, offset=offset))
        artifacts = every(lambda offset: client.read_artifacts(limit=PAGE, offset=offset))
        variables = client.read_variables()
    assert any(r.id == run_id for r in runs) and logs and artifacts
    api = {
        "flow run parameters and states": json.dumps(
            [{"parameters": r.parameters, "state": r.state.message if r.state else None} for r in runs], default=str
        ),
        "logs": "\n".join(log.message for log in logs),
        "artifacts": json.dumps([{"data": a.data, "description": a.description} for a in artifacts], default=str),
        "variables": json.dumps([v.value for v in variables], default=str),
    }
    for secret in secrets:
        leaks = [str(p) for p, content in written.items() if secret.encode() in content]
        leaks += [where for where, text in api.items() if secret in text]
        assert leaks == [], f"a secret was written to {leaks}"
