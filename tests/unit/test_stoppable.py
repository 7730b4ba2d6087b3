"""A stoppable command on this machine (the local transport): stopped with its whole process group, or timed out."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from k3deploy.core.errors import CommandTimeout
from k3deploy.tasks import stoppable
from k3deploy.tasks.stoppable import run_stoppable
from k3deploy.tasks.transport.local import LocalTransport

pytestmark = pytest.mark.launch


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.fixture
def pid_files(monkeypatch) -> list[Path]:
    """The pid files this test's commands were given (other tests, on the other worker, make their own in /tmp)."""
    given: list[Path] = []

    def recorded() -> str:
        given.append(Path(name := real()))
        return name

    real = stoppable.pid_file
    monkeypatch.setattr(stoppable, "pid_file", recorded)
    return given


def test_a_stopped_command_ends_with_every_process_it_started(tmp_path: Path, pid_files: list[Path]):
    here, stop = LocalTransport("here"), threading.Event()
    child = tmp_path / "child.pid"
    started = threading.Event()

    def seen(_host: str, _stream: str, line: str) -> None:
        if line == "started":
            started.set()

    def run() -> None:
        results.append(run_stoppable(lambda c: here.run(c, 120, on_output=seen), lambda c: here.run(c, 30),
                                     f"sleep 600 & echo $! > {child}; echo started; wait", 300, stop))  # fmt: skip

    results: list = []
    worker = threading.Thread(target=run)
    worker.start()
    assert started.wait(60), "the command never started"
    stop.set()
    worker.join(60)
    assert not worker.is_alive() and results[0].exit_code != 0
    assert not alive(int(child.read_text()))  # its background child went with it (the process group)
    assert pid_files and not any(p.exists() for p in pid_files)  # its pid file removed


def test_a_command_not_stopped_returns_its_result_and_leaves_no_pid_file(pid_files: list[Path]):
    here = LocalTransport("here")
    done = run_stoppable(lambda c: here.run(c, 60), lambda c: here.run(c, 30), "echo hello", 30, threading.Event())
    assert (done.exit_code, done.stdout.strip()) == (0, "hello")
    assert pid_files and not any(p.exists() for p in pid_files)


def test_a_command_past_its_timeout_is_a_command_timeout_naming_the_host():
    here = LocalTransport("node7")
    with pytest.raises(CommandTimeout, match=r"^node7: killed after 1s"):  # status 124: `timeout` killed it
        run_stoppable(lambda c: here.run(c, 60), lambda c: here.run(c, 30), "sleep 30", 1, None)
