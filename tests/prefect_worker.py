"""A real `prefect worker start` on a fresh process pool, against the session's Prefect server (a fixture)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID, uuid4

import httpx
import pytest
from prefect.settings import PREFECT_API_URL, PREFECT_LOCAL_STORAGE_PATH

from k3deploy.deployments.definitions import ensure_pool
from tests.prefect_runs import api_at, wait_for

# The worker each `worker` fixture's pool has running now (restart_worker replaces it).
_RUNNING: dict[str, subprocess.Popen[bytes]] = {}


def _start_worker(pool: str, tmp_path: Path) -> None:
    env = os.environ | {
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PREFECT_LOCAL_STORAGE_PATH": str(PREFECT_LOCAL_STORAGE_PATH.value()),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "DO_NOT_TRACK": "1",
    }
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"]
    with (tmp_path / "worker.log").open("a") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (tmp_path / "worker.pid").write_text(str(proc.pid))  # for the test that kills it
    _RUNNING[pool] = proc


@pytest.fixture
def worker(prefect_server: Path, tmp_path: Path) -> Iterator[str]:
    """A real `prefect worker start` on a fresh process pool; its flow runs write to this test's runs store."""
    pool = f"k3d-test-{uuid4().hex[:6]}"
    ensure_pool(pool)
    _start_worker(pool, tmp_path)
    yield pool
    stop_worker(_RUNNING.pop(pool))


def restart_worker(pool: str, tmp_path: Path) -> None:
    """The `worker` fixture's worker stopped (as a service manager stops it) and a new one started on its pool.

    Prefect 3.9's process worker may run a cancelled run's cancellation sequence twice (its event observer and
    its poll); the second looks the run's process up by flow run id, so a Retry of that run started on the same
    worker meanwhile is SIGTERMed (seen in ci38: "Cancelled flow run" logged before and after the Retry's
    process exited with -15). A new worker has no such sequence pending."""
    stop_worker(_RUNNING.pop(pool))
    _start_worker(pool, tmp_path)


# How long each signal is given. `prefect worker start` (3.9.1) passes a first SIGTERM or SIGINT on to the
# worker process it runs, which went on running for over 40 s each time it was tried here; a second signal makes
# it SIGKILL that process and end ("Received SIGINT. Sending SIGKILL to the process worker"), in under a second.
# So the first signal gets a short chance, the second a long one, and SIGKILL ends whatever is left.
STOP_WAITS_S = {signal.SIGTERM: 5, signal.SIGINT: 30, signal.SIGKILL: 30}


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM as a service manager sends it, then SIGINT, then SIGKILL, until the worker's group has ended."""
    for sig, wait_s in STOP_WAITS_S.items():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
            return


def processes_of(run_id: UUID) -> list[int]:
    """Pids of the processes executing a flow run (the worker gives each its run id in the environment)."""
    marker = f"PREFECT__FLOW_RUN_ID={run_id}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if marker in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
    return pids


@contextlib.contextmanager
def started_server(host: str, env: dict[str, str], folder: Path, auth_string: str | None = None) -> Iterator[str]:
    """`prefect server start` of a test's own on a free port of `host`, with `env` (its UI told its API's URL),
    its output in folder/server.log; once /health answers (it asks for no auth), this process's client is
    pointed at it; stopped after. Yields its API URL."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    url = f"http://{host}:{port}/api"
    log_path = folder / "server.log"
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)]
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, env=env | {"PREFECT_UI_API_URL": url}, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def healthy() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        assert proc.poll() is None, log_path.read_text()[-3000:]
        return False

    try:
        wait_for(f"the Prefect server on {host}:{port}", healthy, timeout=180)
        with api_at(url, auth_string):
            yield url
    finally:
        stop_worker(proc)
