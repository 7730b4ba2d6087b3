"""Launch on the test bed (a pytest plugin, see conftest.py): the stand-in's fault control and our containers.

Faults go to one node only through the stand-in's control file, which sits in that host's private
model root (mounted into its container): the other nodes have no such file.
"""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3deploy.blocks.serve import SEED_ENV
from k3deploy.tasks.containers import CONFIG_LABEL
from k3deploy.tasks.transport import docker_client
from tests.bedconfig import bed_config, bed_transports, write_config

CONTROL = "/srv/models/k3sim-control.json"
NAME = "vllm-kimi-k3"


@pytest.fixture
def runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run records and container logs stay in the test's folder."""
    monkeypatch.setenv("K3DEPLOY_RUNS_DIR", str(tmp_path / "runs"))  # container logs stay in the test's folder


@pytest.fixture
def bed_nodes(testbed) -> Iterator[dict[str, Any]]:
    transports = bed_transports(testbed)
    clients = {name: docker_client(t) for name, t in transports.items()}
    for t in transports.values():
        t.run(f"rm -f {CONTROL}", 30).check()
    yield {"transports": transports, "clients": clients}
    for name, client in clients.items():
        for container in client.containers.list(all=True, filters={"name": NAME}):
            container.remove(force=True)
        transports[name].run(f"rm -f {CONTROL}", 30)
        client.close()
        transports[name].close()


def launch_data(bed, startup_s: float = 0.5, **changes: Any) -> dict[str, Any]:
    """The bed deployment with the stand-in told where its control file is, and quick readiness polling."""
    repository = bed.image_ref_by_digest.split("@")[0]
    image = {"image__ref": f"{repository}:1", "image__digest": bed.image_digest}
    data = bed_config(bed, **(image | changes))
    data["serve"]["env"] = {
        **SEED_ENV,
        "K3SIM_CHECK_MODEL": "0",
        "K3SIM_STARTUP_S": str(startup_s),
        "K3SIM_CONTROL_FILE": CONTROL,
    }
    data["serve"]["readiness"] = {"timeout_s": 120, "poll_s": 0.5, "request_timeout_s": 10}
    return data


def launch_config(bed, tmp_path: Path, startup_s: float = 0.5, **changes: Any) -> str:
    """launch_data written to a YAML file of its own in the test's folder."""
    return write_config(tmp_path / f"deploy-{random.randrange(10**9)}.yaml", launch_data(bed, startup_s, **changes))


def control(bed_nodes, node: str, **settings: Any) -> None:
    text = json.dumps({k: str(v) for k, v in settings.items()})
    bed_nodes["transports"][node].run(f"printf %s {shlex.quote(text)} > {CONTROL}", 30).check()


def ours(bed_nodes) -> dict[str, list[str]]:
    """Containers carrying a k3deploy config label, per node."""
    return {
        n: [c.name for c in cl.containers.list(all=True, filters={"label": CONFIG_LABEL})]
        for n, cl in bed_nodes["clients"].items()
    }
