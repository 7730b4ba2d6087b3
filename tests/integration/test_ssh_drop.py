"""An SSH connection dropped in the middle of a long command, for real, on the test bed.

The drop is the sshd process serving the connection killed on the bed host while the command runs:
the command prints its pid first, the output callback walks its parents up to that sshd and kills
it, so the drop lands mid-command every time, with no sleep as synchronisation. A command that only
reads is run again on a fresh connection and returns its real result; any other surfaces the drop,
naming the node, and is run exactly once. Each command counts its runs in a file on the node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3deploy.blocks.cluster import ClusterConfig
from k3deploy.core.errors import ConnectionFault
from k3deploy.core.stage import Verdict
from k3deploy.flows.preflight import preflight
from k3deploy.tasks.preflight import gather
from k3deploy.tasks.transport import (
    CommandInterrupted,
    RetryPolicy,
    SSHTransport,
    Transport,
    run_all,
    run_idempotent,
    run_once,
)
from k3deploy.tasks.transport.base import OutputCallback
from k3deploy.tasks.transport.factory import transports_for
from tests.bedconfig import bed_config, write_config

pytestmark = [pytest.mark.testbed, pytest.mark.transport, pytest.mark.faults]


# -- dropping a live connection ------------------------------------------------------------------


def _proc(pid: int) -> tuple[int, str]:
    """(parent pid, full command line) of a process on this machine (the bed's hosts share its pid namespace)."""
    ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return ppid, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def session_sshd(pid: int) -> int:
    """The sshd process serving the connection that `pid` runs under: its ancestor just below the listener."""
    while pid > 1:
        ppid, cmdline = _proc(pid)
        if "[listener]" in _proc(ppid)[1]:
            assert cmdline.startswith("sshd:") and "[listener]" not in cmdline, cmdline
            return pid
        pid = ppid
    raise AssertionError("no sshd listener above the command: is it running on a bed host?")


def drop_connection(pid: int) -> None:
    """Kill the sshd session serving the command `pid`: the TCP connection dies with the command still running."""
    os.kill(session_sshd(pid), signal.SIGKILL)


class Dropper:
    """An output callback that drops the connection of a command when it prints `pid N run K` and K is a run
    to drop; it remembers every pid it saw, to clean up the orphans the drops leave on the nodes."""

    def __init__(self, drop_runs: set[int], only: str | None = None) -> None:
        self.drop_runs, self.only = drop_runs, only
        self.lines: list[tuple[str, str, str]] = []
        self.pids: list[int] = []
        self.dropped: list[tuple[str, int]] = []

    def __call__(self, host: str, stream: str, line: str) -> None:
        self.lines.append((host, stream, line))
        word, _, rest = line.partition(" ")
        if stream != "stdout" or word != "pid" or (self.only and host != self.only):
            return
        pid, run = (int(x) for x in rest.split(" run "))
        self.pids.append(pid)
        if run in self.drop_runs:
            self.dropped.append((host, run))
            drop_connection(pid)

    def kill_orphans(self) -> None:
        """A dropped command keeps running on the node (its node-side timeout would end it); end it now."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)  # `timeout` leads its own group: the command's tree


def counted(log: str, then: str) -> str:
    """A long command that counts its runs in `log` on the node, says its pid and run, then does `then`.

    `then` may use $n, the number of this run.
    """
    return f'echo ran >> {log}; n=$(wc -l < {log}); echo "pid $$ run $n"; {then}'


LONG_ON_FIRST_RUN = 'if [ "$n" -eq 1 ]; then sleep 600; fi; echo "result of run $n"'


def runs_on_node(t: Transport, log: str) -> int:
    return len(t.run(f"cat {log}", 10).check().stdout.splitlines())


@pytest.fixture
def nodes(testbed) -> Iterator[dict[str, SSHTransport]]:
    ts = {
        h.name: SSHTransport(
            h.ip, name=h.name, private_key_file=testbed.key, known_hosts=testbed.known_hosts, connect_timeout=5
        )
        for h in testbed.hosts[:4]
    }
    yield ts
    for t in ts.values():
        t.close()


@pytest.fixture
def log_file(nodes) -> Iterator[str]:
    """A fresh run-count file on every node, removed afterwards."""
    path = f"/tmp/k3-drop-{uuid.uuid4().hex}"
    yield path
    run_all(nodes, f"rm -f {path}", timeout=10)


@pytest.fixture
def dropper_cleanup() -> Iterator[list[Dropper]]:
    made: list[Dropper] = []
    yield made
    for d in made:
        d.kill_orphans()


# -- the transport ---------------------------------------------------------------------------------


def test_idempotent_command_dropped_mid_run_is_run_again_and_returns_its_real_result(
    nodes, log_file, dropper_cleanup, caplog
):
    t = nodes["node1"]
    first_connection = t.connect().get_transport()
    drops = Dropper({1})
    dropper_cleanup.append(drops)
    with caplog.at_level(logging.WARNING, logger="k3deploy.transport"):
        result = run_idempotent(
            t, counted(log_file, LONG_ON_FIRST_RUN), 30, drops, purpose="reading a test file", policy=RetryPolicy()
        )
    assert drops.dropped == [("node1", 1)]
    assert result.exit_code == 0
    assert result.stdout == f"pid {drops.pids[1]} run 2\nresult of run 2\n"  # the second run's output only
    assert runs_on_node(t, log_file) == 2
    assert t.connect().get_transport() is not first_connection  # it reconnected
    warned = [r.getMessage() for r in caplog.records if r.name == "k3deploy.transport"]
    assert len(warned) == 1
    assert warned[0].startswith("node1: connection dropped while reading a test file (attempt 1 of 3: ")
    assert warned[0].endswith("it only reads, so it runs again in 0.5s")


def test_command_that_changes_the_node_is_not_run_again_after_a_drop(nodes, log_file, dropper_cleanup):
    t = nodes["node2"]
    drops = Dropper({1})
    dropper_cleanup.append(drops)
    with pytest.raises(ConnectionFault) as info:
        run_once(t, counted(log_file, "sleep 600; echo done"), 30, drops, purpose="starting a test service")
    err = info.value
    assert isinstance(err, CommandInterrupted) and err.host == "node2"
    assert str(err).startswith("node2: connection dropped while starting a test service ('echo ran >> /tmp/k3-drop-")
    assert "its result is unknown" in str(err) and "not run again" in str(err)
    assert drops.dropped == [("node2", 1)]
    assert runs_on_node(t, log_file) == 1  # exactly once; and the transport reconnects for the next command


def test_plain_run_never_runs_again_and_says_the_result_is_unknown(nodes, log_file, dropper_cleanup):
    t = nodes["node3"]
    drops = Dropper({1})
    dropper_cleanup.append(drops)
    with pytest.raises(
        CommandInterrupted, match=r"^node3: connection dropped while 'echo ran >> .*; its result is unknown"
    ):
        t.run(counted(log_file, "sleep 600"), 30, drops)
    assert runs_on_node(t, log_file) == 1


def test_an_idempotent_command_that_keeps_dropping_gives_up_after_its_attempts(nodes, log_file, dropper_cleanup):
    t = nodes["node0"]
    drops = Dropper({1, 2, 3, 4})
    dropper_cleanup.append(drops)
    policy = RetryPolicy(attempts=3, first_pause_s=0.1)
    with pytest.raises(CommandInterrupted) as info:
        run_idempotent(t, counted(log_file, "sleep 600"), 30, drops, purpose="reading a test file", policy=policy)
    assert str(info.value).startswith("node0: connection dropped while reading a test file ('echo ran >> ")
    assert "on each of 3 attempt(s)" in str(info.value) and "gave up" in str(info.value)
    assert drops.dropped == [("node0", 1), ("node0", 2), ("node0", 3)]
    assert runs_on_node(t, log_file) == 3  # bounded: never a fourth


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "changes-the-node"])
def test_fan_out_retries_only_an_idempotent_command_of_the_node_that_dropped(
    nodes, log_file, dropper_cleanup, idempotent
):
    drops = Dropper({1}, only="node2")
    dropper_cleanup.append(drops)
    command = counted(
        log_file, 'if [ "$n" -eq 1 ] && [ "$(hostname)" = node2 ]; then sleep 600; fi; echo "result of run $n"'
    )
    results = run_all(nodes, command, 30, drops, idempotent=idempotent, purpose="counting test runs")
    assert drops.dropped == [("node2", 1)]
    for name in ("node0", "node1", "node3"):
        assert results[name].stdout.endswith("result of run 1\n")  # type: ignore[union-attr]
    runs = {name: runs_on_node(t, log_file) for name, t in nodes.items()}
    if idempotent:
        assert results["node2"].stdout.endswith("result of run 2\n")  # type: ignore[union-attr]
        assert runs == {"node0": 1, "node1": 1, "node2": 2, "node3": 1}
    else:
        err = results["node2"]
        assert isinstance(err, CommandInterrupted)
        assert str(err).startswith("node2: connection dropped while counting test runs (")
        assert "its result is unknown" in str(err)
        assert runs == {"node0": 1, "node1": 1, "node2": 1, "node3": 1}


def test_a_command_killed_by_a_signal_on_a_live_connection_is_not_taken_for_a_drop(nodes, log_file):
    t = nodes["node1"]
    result = run_idempotent(t, counted(log_file, "kill -9 $$"), 10, purpose="reading a test file")
    assert result.exit_code == -1 and result.stdout.startswith("pid ")  # the command's own end: returned, not re-run
    assert runs_on_node(t, log_file) == 1


# -- preflight -----------------------------------------------------------------------------------


class DropsFirstFactsScript(SSHTransport):
    """A bed node whose first command (its facts script) runs in full, prints its pid, then holds its
    connection open until the test's callback has killed it: a drop in the middle of the gather."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.commands: list[str] = []
        self.dropper = Dropper({1})

    def run(
        self, command: Any, timeout: float, on_output: OutputCallback | None = None, stdin: bytes | None = None
    ) -> Any:
        self.commands.append(command)
        if len(self.commands) > 1:
            return super().run(command, timeout, on_output, stdin)
        held = f'{command}\necho "pid $$ run 1"\nsleep 600\n'
        return super().run(held, timeout, self.dropper, stdin)


@pytest.mark.preflight
@pytest.mark.prefect
def test_preflight_passes_when_a_node_connection_drops_mid_gather(prefect_server, testbed, tmp_path, monkeypatch):
    made: dict[str, DropsFirstFactsScript] = {}

    @contextlib.contextmanager
    def bed_transports(cluster: ClusterConfig) -> Iterator[dict[str, Transport]]:
        ts = transports_for(cluster)
        node1 = cluster.nodes[1]
        ssh = cluster.ssh
        made["node1"] = ts["node1"] = DropsFirstFactsScript(
            node1.address, name=node1.name, user=ssh.user, port=ssh.port, known_hosts=ssh.known_hosts,
            private_key_file=ssh.private_key_file, connect_timeout=ssh.connect_timeout_s,
        )  # fmt: skip
        try:
            yield ts
        finally:
            for t in ts.values():
                t.close()

    monkeypatch.setattr(gather, "open_transports", bed_transports)
    path = write_config(tmp_path / "deploy.yaml", bed_config(testbed))
    try:
        result = preflight(config=path)
    finally:
        if "node1" in made:
            made["node1"].dropper.kill_orphans()
    node1 = made["node1"]
    assert node1.dropper.dropped == [("node1", 1)]
    assert len(node1.commands) == 2 and node1.commands[0] == node1.commands[1]  # the same facts script, again
    assert result.verdict is Verdict.PASS and result.failures == []
    assert result.data["nodes"]["node1"]["driver"] == "24.1.rc3.7"
