"""`validate` on the test bed: the whole chain, a failure at launch, and a retry of the same flow run.

Real sshd hosts, the local hub, Podman engines with the stand-in image, a real Prefect server.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.flow_engine import run_flow
from prefect.states import AwaitingRetry

from k3deploy.core.errors import ValidateFailed
from k3deploy.core.paths import runs_dir
from k3deploy.flows.validate import validate
from k3deploy.localhub import HubServer, publish
from k3deploy.records.record import SCHEMA_PATH, RunRecord
from tests.bedconfig import bed_transports, write_config
from tests.checkpoints import checkpoint_files
from tests.launchbed import control, launch_data, ours

pytestmark = [pytest.mark.e2e, pytest.mark.testbed, pytest.mark.prefect, pytest.mark.usefixtures("runs_dir")]
REPO = "k3test/validate"
BODY = ["preflight", "models", "comm", "image", "launch"]
# bench and accuracy need the real tools, which the stand-in image lacks (test_vllm_containers_bed.py runs bench
# in a real vLLM container); smoke runs against the stand-in.
ON_BED = [*BODY, "smoke"]


@pytest.fixture(scope="module")
def hub(testbed, tmp_path_factory) -> Iterator[HubServer]:
    """The checkpoint on the local hub; its copies on the nodes are removed afterwards."""
    with HubServer(tmp_path_factory.mktemp("hub"), host=testbed.state.bridge["ip"]) as server:
        publish(server.root, REPO, checkpoint_files(11))
        yield server
    for transport in bed_transports(testbed).values():
        transport.run(f"rm -rf /srv/models/{REPO.split('/')[1]}", 60).check()
        transport.close()


def config(bed, hub: HubServer, tmp_path: Path, **changes: Any) -> str:
    data = launch_data(
        bed, models__hub="huggingface", models__hub_endpoint=hub.url, models__target={"repo": REPO}, **changes
    )
    return write_config(tmp_path / f"deploy-{random.randrange(10**9)}.yaml", data)


def record_of(run_id: Any) -> dict[str, Any]:
    document = json.loads((runs_dir() / str(run_id) / "record.json").read_text())
    jsonschema.validate(document, json.loads(SCHEMA_PATH.read_text()))
    return document


def verdicts(document: dict[str, Any]) -> dict[str, str]:
    return {s["stage"]: s["verdict"] for s in document["stages"]}


def child_runs(parent_id: Any) -> dict[str, list[Any]]:
    """Stage name → its subflow runs under this validate run, oldest first."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id]))
        )
        names = {r.flow_id: client.read_flow(r.flow_id).name for r in runs}
    out: dict[str, list[Any]] = {}
    for r in sorted(runs, key=lambda r: r.created):
        out.setdefault(names[r.flow_id], []).append(r)
    return out


def test_validate_runs_every_stage_and_writes_a_record_that_fits_the_schema(
    prefect_server, testbed, bed_nodes, hub, tmp_path
):
    state = validate(config=config(testbed, hub, tmp_path), only=ON_BED, return_state=True)
    assert state.is_completed(), state.message
    document = record_of(state.state_details.flow_run_id)
    assert verdicts(document) == dict.fromkeys([*ON_BED, "teardown"], "pass")
    assert document["verdict"] == "pass" and document["failed_stage"] is None
    assert set(document["node_facts"]) == {"node0", "node1", "node2", "node3"}
    assert all(key.startswith("SHA256:") for key in document["host_keys"].values())
    assert [(c["role"], c["repo"]) for c in document["checkpoints"]] == [("target", REPO)]
    assert document["image"]["digest"] == testbed.image_digest
    assert [n["node"] for n in document["plan"]["nodes"]] == ["node0", "node1", "node2", "node3"]
    assert document["config"]["cluster"]["ssh"]["private_key"] is None
    RunRecord.model_validate(document)
    assert not any(ours(bed_nodes).values())  # teardown at the end


def test_a_failed_launch_is_named_leaves_nothing_and_a_retry_of_the_same_run_skips_what_passed(
    prefect_server, testbed, bed_nodes, hub, tmp_path
):
    control(bed_nodes, "node3", K3SIM_STARTUP_S=600, K3SIM_DIE_AFTER_S=1, K3SIM_DIE_EXIT_CODE=0)
    state = validate(config=config(testbed, hub, tmp_path), only=ON_BED, return_state=True)
    assert state.is_failed()
    with pytest.raises(ValidateFailed, match=r"validate failed at launch: node3 \(DP rank 3\): the container exited"):
        state.result()
    run_id = state.state_details.flow_run_id
    document = record_of(run_id)
    assert verdicts(document) == {
        **dict.fromkeys(BODY[:-1], "pass"),
        "launch": "fail",
        "smoke": "skipped",
        "teardown": "pass",
    }
    assert document["failed_stage"] == "launch"
    assert not any(ours(bed_nodes).values())
    before = child_runs(run_id)

    # The fault is cleared; the run is retried as the UI's Retry does (the same flow run, AwaitingRetry).
    control(bed_nodes, "node3")
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, AwaitingRetry(message="Retry from the test"), force=True)
        flow_run = client.read_flow_run(run_id)
    retried = run_flow(validate, flow_run=flow_run, return_type="state")
    assert retried.is_completed(), retried.message
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run_id).run_count == 2

    after = child_runs(run_id)
    for cached in ("models", "comm", "image"):  # passed and persisted: not executed again
        assert [r.id for r in after[cached]] == [r.id for r in before[cached]]
        assert after[cached][0].run_count == 1 and after[cached][0].end_time == before[cached][0].end_time
    assert len(after["launch"]) == 2 and after["launch"][-1].state.is_completed()  # failed: run again
    assert len(after["preflight"]) == 2  # never cached: host keys are checked on every run
    assert verdicts(record_of(run_id)) == dict.fromkeys([*ON_BED, "teardown"], "pass")
    assert not any(ours(bed_nodes).values())
