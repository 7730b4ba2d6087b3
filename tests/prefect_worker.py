"""A real `prefect worker start` on a fresh process pool, against the session's Prefect server (a fixture)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID, uuid4

import pytest
from prefect.settings import PREFECT_API_URL, PREFECT_LOCAL_STORAGE_PATH

from k3deploy.deployments.definitions import ensure_pool


@pytest.fixture
def worker(prefect_server: Path, tmp_path: Path) -> Iterator[str]:
    """A real `prefect worker start` on a fresh process pool; its flow runs write to this test's runs store."""
    pool = f"k3d-test-{uuid4().hex[:6]}"
    ensure_pool(pool)
    env = os.environ | {
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "PREFECT_LOCAL_STORAGE_PATH": str(PREFECT_LOCAL_STORAGE_PATH.value()),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "DO_NOT_TRACK": "1",
    }
    log = (tmp_path / "worker.log").open("w")
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"]
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (tmp_path / "worker.pid").write_text(str(proc.pid))  # for the test that kills it
    yield pool
    stop_worker(proc)
    log.close()


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM as a service manager sends it, then SIGINT, then SIGKILL, each given 30 s: prefect 3.9.1's
    worker forwards the SIGTERM to itself as a SIGINT and, seen here, keeps running until a second signal."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
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
