"""The process runtime's teardown against real process groups on this machine (no vLLM needed).

The server the runtime starts is a child of a tracked wrapper (`sh -c 'vllm serve …; echo $? >rc'`); when
the wrapper dies first, its child lives on in the same process group. Teardown must stop that group and
call the server removed only when nothing of it is left.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3deploy.tasks.render import CONFIG_LABEL, NODE_LABEL, PORTS_LABEL, ProcessSpec
from k3deploy.tasks.runtime import ProcessRuntime, ServersSurvived
from k3deploy.tasks.teardown import removed_summary
from k3deploy.tasks.transport.local import LocalTransport
from tests.ports import port_free

pytestmark = [pytest.mark.launch, pytest.mark.faults, pytest.mark.anywhere]

LABELS = {CONFIG_LABEL: "cfg-teardown", NODE_LABEL: "local1"}


def group(pgid: int) -> list[str]:
    """Live (not zombie) members of a process group, read from ps here."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,pgid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[1] == str(pgid) and not line.split()[2].startswith("Z")]


def start(root: Path, command: list[str], labels: dict[str, str] = LABELS) -> tuple[ProcessRuntime, ProcessSpec, int]:
    spec = ProcessSpec("srv-local1", str(root / "srv-local1"), {"A": "1"}, command, dict(labels))
    runtime = ProcessRuntime("local1", LocalTransport("local1"), str(root), grace_s=2.0)
    runtime.transport.run(spec.start_script(), timeout=30).check()
    leader = int((root / "srv-local1" / "pid").read_text())
    return runtime, spec, leader


def wait_for_child(leader: int) -> int:
    """The server process under the wrapper: waited for by reading /proc, bounded."""
    for _ in range(200):
        children = Path(f"/proc/{leader}/task/{leader}/children")
        found = children.read_text().split() if children.exists() else []
        if found:
            return int(found[0])
        time.sleep(0.05)  # polling a state, bounded: 200 looks
    raise AssertionError(f"the wrapper {leader} started no child")


def test_a_server_whose_tracked_wrapper_was_killed_is_still_stopped_and_only_then_called_removed(
    tmp_path: Path,
) -> None:
    runtime, spec, leader = start(tmp_path, ["sleep", "600"])
    server = wait_for_child(leader)
    os.kill(leader, signal.SIGKILL)  # the wrapper k3deploy tracks dies; its child, the "engine", runs on
    assert any(line.split()[0] == str(server) for line in group(leader)), "the engine should outlive its wrapper"
    assert runtime.names(LABELS) == ["srv-local1"]

    assert runtime.remove(LABELS) == ["srv-local1"]

    assert group(leader) == []
    assert not Path(spec.state_dir).exists()
    assert runtime.names(LABELS) == []


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    runtime, _spec, leader = start(tmp_path, ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"])
    wait_for_child(leader)
    assert runtime.remove(LABELS) == ["srv-local1"]
    assert group(leader) == []


def test_a_process_that_survives_the_kill_is_named_and_the_node_is_not_called_clear(tmp_path: Path) -> None:
    """A process stuck in the kernel (an NPU driver call, state D) outlives SIGKILL; that cannot be made on
    demand here, so `ps` is replaced by one that still lists a member of the group: a simulated fault."""
    runtime, spec, leader = start(tmp_path, ["sleep", "600"])
    wait_for_child(leader)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ps").write_text(f"#!/bin/sh\necho '{leader + 1} {leader} D vllm serve /models/k3 --headless'\n")
    (fake / "ps").chmod(0o755)
    stuck = ProcessRuntime("local1", _PathTransport("local1", fake), str(tmp_path), grace_s=0.5)
    try:
        with pytest.raises(ServersSurvived) as caught:
            stuck.remove(LABELS)
        assert caught.value.removed == []
        assert "srv-local1" in str(caught.value) and "vllm serve /models/k3 --headless" in str(caught.value)
        assert Path(spec.state_dir).exists(), "the folder is kept, so a later teardown tries again"
    finally:
        runtime.remove(LABELS)
    assert group(leader) == []


def listener(port: int, pid_file: Path, *, leave_group: bool) -> list[str]:
    """A server listening on `port`; with `leave_group`, started through setsid, so it leaves the wrapper's
    process group as a daemonising child would, and a stop of the group cannot reach it."""
    code = (
        "import os, socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "time.sleep(600)"
    )
    return ["setsid", sys.executable, "-c", code] if leave_group else [sys.executable, "-c", code]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int) -> None:
    for _ in range(600):
        if not port_free(port):
            return
        time.sleep(0.05)  # polling a state, bounded: 600 looks
    raise AssertionError(f"nothing came to listen on port {port}")


def test_a_server_on_its_port_is_stopped_and_the_port_is_free_before_it_is_called_removed(tmp_path: Path) -> None:
    port = free_port()
    runtime, spec, leader = start(tmp_path, listener(port, tmp_path / "srv.pid", leave_group=False),
                                  LABELS | {PORTS_LABEL: str(port)})  # fmt: skip
    wait_listening(port)
    assert runtime.remove(LABELS) == ["srv-local1"]
    assert group(leader) == [] and port_free(port) and not Path(spec.state_dir).exists()


def test_a_child_that_left_the_group_and_holds_the_port_is_named_and_the_node_is_not_called_clear(
    tmp_path: Path,
) -> None:
    port, pid_file = free_port(), tmp_path / "escaped.pid"
    runtime, spec, leader = start(tmp_path, ["sh", "-c", shlex.join(listener(port, pid_file, leave_group=True))],
                                  LABELS | {PORTS_LABEL: f"{port},not-a-port"})  # fmt: skip
    wait_listening(port)
    escaped = int(pid_file.read_text())
    try:
        with pytest.raises(ServersSurvived) as caught:
            runtime.remove(LABELS)
        assert group(leader) == [], "the group itself is stopped"
        assert f"port {port} is still listened on (by pid {escaped}: {sys.executable} -c" in str(caught.value)
        assert caught.value.removed == [] and Path(spec.state_dir).exists(), "kept, so a later teardown tries again"
    finally:
        os.kill(escaped, signal.SIGKILL)
    for _ in range(600):  # the kernel frees the port once the process is reaped: a state, polled, bounded
        if port_free(port):
            break
        time.sleep(0.05)
    assert runtime.remove(LABELS) == ["srv-local1"] and not Path(spec.state_dir).exists()


class _PathTransport(LocalTransport):
    def __init__(self, host: str, first: Path) -> None:
        super().__init__(host)
        self.first = first

    def run(self, command, timeout, on_output=None, stdin=None):  # type: ignore[no-untyped-def, override]
        return super().run(f"PATH={self.first}:$PATH; {command}", timeout, on_output, stdin)


def test_the_teardown_summary_names_every_server_with_its_nodes_in_a_whole_sentence() -> None:
    docker = {f"node{i}": ["vllm-kimi-k3"] for i in range(4)}
    assert removed_summary(docker) == "removed 4: vllm-kimi-k3 on node0, node1, node2 and node3."
    local = {"local0": ["vllm-kimi-k3-local0"], "local1": ["vllm-kimi-k3-local1"]}
    assert removed_summary(local) == "removed 2: vllm-kimi-k3-local0 on local0 and vllm-kimi-k3-local1 on local1."
    assert removed_summary({"local0": [], "local1": []}) == "nothing was running."
