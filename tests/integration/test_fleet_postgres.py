"""A fleet on one Prefect server backed by PostgreSQL: two clusters' nightly deployments (named per cluster) on
one pool served by two process workers; both clusters' runs hold their clusters at once, and a second run on
one cluster waits for the first, whichever worker picks it up.

The server is `k3deploy server start --auth` with Prefect's database URL set to the session's PostgreSQL: its
API refuses a client without the auth string it keeps in a file only its owner reads, and the workers and the
test use that string. The clusters are the stand-in profile twice (their own ports, names and start-up gates).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID, uuid4

import httpx
import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.variables import Variable

from k3deploy.blocks.loader import load_config
from k3deploy.cli import server
from k3deploy.deployments.definitions import apply
from k3deploy.flows.cluster_lock import lock_name
from tests.bedconfig import write_config
from tests.postgres import needs_postgres, psql
from tests.prefect_runs import api_at, finished, logged, wait_for
from tests.prefect_worker import stop_worker
from tests.standin_profile import standin_profile
from tests.vllm_env import needs_vllm_env

pytestmark = [
    pytest.mark.anywhere,  # its own ports (18400, 18500), PostgreSQL and server: beside either worker
    pytest.mark.prefect,
    pytest.mark.vllm,
    needs_vllm_env,
    needs_postgres,
    pytest.mark.usefixtures("runs_dir"),
]


@pytest.fixture
def pg_server(postgres: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[server.ServerInfo]:
    monkeypatch.setenv("K3DEPLOY_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", postgres)  # the production layout's one setting
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    started = subprocess.run([sys.executable, "-m", "k3deploy", "server", "start", "--auth"], capture_output=True,
                             text=True, timeout=300, check=False)  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        info = server.recorded()
        assert info is not None and info.auth_file is not None, started.stdout
        assert f"API auth on (auth string in {info.auth_file})" in started.stdout
        auth_file = Path(info.auth_file)
        assert auth_file.stat().st_mode & 0o777 == 0o600
        # without the string the API refuses even a listing; /health stays open (probes, `k3deploy server`)
        refused = httpx.post(f"{info.url}/block_documents/filter", json={"include_secrets": True}, timeout=30)
        assert refused.status_code == 401, refused.text
        assert httpx.get(f"{info.url}/health", timeout=30).status_code == 200
        with api_at(info.url, auth_file.read_text().strip()):
            yield info
    finally:
        server.stop()


@pytest.fixture
def two_workers(pg_server: server.ServerInfo, tmp_path: Path) -> Iterator[str]:
    pool = f"k3d-fleet-{uuid4().hex[:6]}"
    auth = Path(str(pg_server.auth_file)).read_text().strip()
    env = os.environ | {"PREFECT_API_URL": pg_server.url, "PREFECT_API_AUTH_STRING": auth,
                        "PREFECT_WORKER_QUERY_SECONDS": "1", "DO_NOT_TRACK": "1"}  # fmt: skip
    procs, logs = [], []
    for name in ("worker-1", "worker-2"):
        logs.append((tmp_path / f"{name}.log").open("w"))
        command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process",
                   "--name", name]  # fmt: skip
        procs.append(subprocess.Popen(command, env=env, stdout=logs[-1], stderr=subprocess.STDOUT,
                                      start_new_session=True))  # fmt: skip
    yield pool
    for proc in procs:
        stop_worker(proc)
    for log in logs:
        log.close()


def gated_cluster(tmp_path: Path, name: str, port: int, rpc_port: int) -> str:
    """The stand-in profile as cluster `name`, whose servers finish starting only once its gate opens."""
    folder = tmp_path / name
    data = standin_profile(folder, port=port, rpc_port=rpc_port)
    data["cluster"]["name"] = f"{name}-{uuid4().hex[:6]}"
    data["serve"]["readiness"]["timeout_s"] = 900
    data["serve"]["env"]["K3SIM_CONTROL_FILE"] = str(folder / "gate.json")
    (folder / "gate.json").write_text(json.dumps({"K3SIM_STARTUP_S": 3600}))
    return write_config(folder / "site.yaml", data)


def open_gate(tmp_path: Path, name: str) -> None:
    (tmp_path / name / "gate.json").write_text(json.dumps({"K3SIM_STARTUP_S": 0.5}))


def children(run_id: UUID) -> list[FlowRun]:
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id]))
        )


def holder(config: str) -> str | None:
    value = Variable.get(lock_name(load_config(config).cluster), default=None)
    return value.get("run_id") if isinstance(value, dict) else None


def test_two_clusters_run_at_once_and_a_second_run_on_one_waits_on_a_postgres_backed_server(
    postgres, pg_server, two_workers, tmp_path
):
    a, b = gated_cluster(tmp_path, "fleet-a", 18400, 13700), gated_cluster(tmp_path, "fleet-b", 18500, 13800)
    deployed = {**apply(a, two_workers, cluster="fleet-a"), **apply(b, two_workers, cluster="fleet-b")}
    assert {"nightly-fleet-a", "nightly-fleet-b", "validate-fleet-a", "validate-fleet-b"} <= set(deployed)

    first_a = run_deployment("validate/nightly-fleet-a", parameters={"only": ["launch"]}, timeout=0)
    first_b = run_deployment("validate/nightly-fleet-b", parameters={"only": ["launch"]}, timeout=0)
    # Both clusters held at once: neither run can end before its gate opens.
    wait_for("both clusters to be held", lambda: (holder(a), holder(b)) == (str(first_a.id), str(first_b.id)), 300)
    second_a = run_deployment("validate/validate-fleet-a", parameters={"only": ["launch"]}, timeout=0)
    said = logged(second_a.id, "waiting for it", timeout=300)
    assert f"({first_a.id})" in said and holder(a) == str(first_a.id)

    open_gate(tmp_path, "fleet-b")
    assert finished(first_b.id, timeout=600).state.type is StateType.COMPLETED
    assert holder(a) == str(first_a.id)  # cluster b's end frees b only
    open_gate(tmp_path, "fleet-a")
    runs = [finished(r.id, timeout=600) for r in (first_a, second_a)]
    assert [r.state.type for r in runs] == [StateType.COMPLETED] * 2
    stages = children(second_a.id)
    released = max(r.end_time for r in children(first_a.id))  # its last stage: the hold ends there
    assert stages and all(r.start_time >= released for r in stages)  # only after the first run's stages

    # The server kept all of it in PostgreSQL: the three runs (and their stage subflows) are rows there.
    ids = ", ".join(f"'{r.id}'" for r in (first_a, first_b, second_a))
    assert psql(postgres, f"select count(*) from flow_run where id in ({ids}) and state_type = 'COMPLETED'") == "3"
    workers = psql(postgres, "select count(distinct name) from worker where name in ('worker-1', 'worker-2')")
    assert workers == "2"
