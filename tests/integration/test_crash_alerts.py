"""A nightly run killed with its worker (SIGKILL, mid-bench) is marked Crashed by the server once its heartbeats
stop, and the server sends exactly one CRASHED alert to a real webhook receiver within the stated bound; the cluster
is free for the next run, which ends normally and sends none (issue 48). The PostgreSQL-backed production layout
shows the same in tests/integration/test_fleet_bed.py.

A `prefect server start` of the test's own (SQLite, every service on as a user runs it: the session's server keeps
its triggers off), a real process worker, `k3deploy deploy`'s automations, the stand-in profile made slow (40 ms a
token) so the bench is still running when the worker dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from prefect import get_client
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from k3deploy.deployments.automations import crash_alert_name, crash_marker_name, webhook_block_name
from k3deploy.deployments.definitions import apply, ensure_pool
from k3deploy.flows.run_labels import STAGE_LABEL
from tests.bedconfig import write_config
from tests.prefect_runs import finished, flow_run, run_logs, wait_for
from tests.prefect_worker import processes_of, started_server, stop_worker
from tests.standin_profile import bench_runs_left, standin_profile
from tests.vllm_env import needs_vllm_env
from tests.webhook import delivered, receiving

pytestmark = [pytest.mark.standin, pytest.mark.prefect, pytest.mark.faults, pytest.mark.vllm, needs_vllm_env,
              pytest.mark.usefixtures("runs_dir"), pytest.mark.timeout(900)]  # fmt: skip
GRACE_S = 10  # server.grace_seconds: with Prefect's shortest heartbeat (30 s), a run silent for 100 s is dead
SILENCE_S = 3 * 30 + GRACE_S
BOUND_S = SILENCE_S + 40  # after the kill: the silence, the triggers service's proactive pass, the POST


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[str]:
    """`prefect server start` on SQLite in a home of the test's own, every service on; this process's client on it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(tmp_path / "server-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1"}  # fmt: skip
    with started_server("127.0.0.1", env, tmp_path) as url:
        yield url


def start_worker(url: str, pool: str, name: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = os.environ | {"PREFECT_API_URL": url, "PREFECT_WORKER_QUERY_SECONDS": "1", "DO_NOT_TRACK": "1",
                        "PREFECT_LOCAL_STORAGE_PATH": str(tmp_path / "storage")}  # fmt: skip
    log = (tmp_path / f"{name}.log").open("w")
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process",
               "--name", name]  # fmt: skip
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return proc


def kill_with_its_runs(worker: subprocess.Popen[bytes], run_id: UUID) -> None:
    """SIGKILL to the worker and to the flow run it executes: nothing of theirs can run a hook or send a state."""
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    for pid in processes_of(run_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for("the killed run's processes to be gone", lambda: not processes_of(run_id), 60)


def labels(run_id: UUID) -> dict[str, Any]:
    return dict(flow_run(run_id).labels or {})


def test_a_nightly_run_killed_with_its_worker_mid_bench_alerts_crashed_once_and_frees_the_cluster(
    own_server: str, tmp_path: Path
):
    with receiving() as (url, received):
        data = standin_profile(tmp_path)
        data["cluster"]["name"] = cluster = f"lab-crash-{uuid4().hex[:6]}"
        data["alerts"] = {"webhook_url": url}
        data["server"] = {"grace_seconds": GRACE_S, "heartbeat_seconds": 30}
        config = write_config(tmp_path / "site.yaml", data)
        pool = f"k3d-crash-{uuid4().hex[:6]}"
        ensure_pool(pool)
        apply(config, pool)
        apply(config, pool)  # a second deploy updates the automations, never doubles them
        with get_client(sync_client=True) as client:
            for name in (crash_marker_name(cluster), crash_alert_name(cluster)):
                assert len(client.read_automations_by_name(name)) == 1, name

        # The nightly run, 40 ms a token: its bench lasts minutes; the worker and the run die while it runs.
        (tmp_path / "control.json").write_text(json.dumps({"K3SIM_TOKEN_S": "0.04"}))
        worker = start_worker(own_server, pool, "worker-a", tmp_path)
        try:
            dead = run_deployment("validate/nightly", parameters={"config": config, "only": ["launch", "bench"]},
                                  timeout=0).id  # fmt: skip
            wait_for("the run's bench to be running", lambda: labels(dead).get(STAGE_LABEL) == "bench"
                     and bench_runs_left(tmp_path), timeout=300)  # fmt: skip
            assert labels(dead)["prefect.worker.name"] == "worker-a"
            kill_with_its_runs(worker, dead)
        finally:
            stop_worker(worker)
        assert flow_run(dead).state.type is StateType.RUNNING  # nothing of the run could say otherwise

        # Within the bound: the run is Crashed on the server, and one message says so.
        ((path, message),) = wait_for("the CRASHED alert", lambda: delivered(received), timeout=BOUND_S)
        crashed = flow_run(dead)
        assert crashed.state.type is StateType.CRASHED and f"no heartbeat for {SILENCE_S} s" in crashed.state.message
        assert path == "/hooks/x" and message["verdict"] == "CRASHED" and message["run_id"] == str(dead)
        assert (message["cluster"], message["failed_stage"], message["worker"]) == (cluster, "bench", "worker-a")
        assert message["host"] == socket.gethostname() and message["failure_class"] == "infrastructure"
        assert message["run_name"] == crashed.name and message["report"] is None
        assert message["text"].startswith(f"k3deploy: run {crashed.name} on cluster {cluster}: CRASHED at bench")
        assert str(message["prefect_run"]).endswith(f"/runs/flow-run/{dead}")

        # The cluster is free for the next nightly run, which ends normally and sends nothing; the dead run's hold
        # (its holder's run final now, its lease expired) stands in no one's way. Still one message in all.
        (tmp_path / "control.json").write_text(json.dumps({}))
        worker = start_worker(own_server, pool, "worker-b", tmp_path)
        try:
            nxt = run_deployment("validate/nightly", parameters={"config": config, "only": ["launch", "bench"]},
                                 timeout=0).id  # fmt: skip
            assert finished(nxt, timeout=600).state.type is StateType.COMPLETED
        finally:
            stop_worker(worker)
        assert any(m.startswith(f"holding cluster {cluster}") for m in run_logs(nxt)), run_logs(nxt)
        assert delivered(received) == []

    # Alerts turned off and deployed again: the alert and the block that kept the URL are gone, the marker stays.
    del data["alerts"]
    apply(write_config(tmp_path / "site.yaml", data), pool)
    with get_client(sync_client=True) as client:
        assert client.read_automations_by_name(crash_alert_name(cluster)) == []
        assert len(client.read_automations_by_name(crash_marker_name(cluster))) == 1
        with pytest.raises(ObjectNotFound):
            client.read_block_document_by_name(webhook_block_name(cluster), "custom-webhook")
