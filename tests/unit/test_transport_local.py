"""The local transport (the local profile's nodes) and the transport's pure pieces."""

from __future__ import annotations

import logging
import pickle
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from k3deploy.core.errors import CommandFailed, CommandTimeout, ConnectionFault
from k3deploy.tasks.transport import (
    CommandInterrupted,
    CommandResult,
    LocalTransport,
    RetryPolicy,
    run_all,
    run_idempotent,
    run_once,
    transports_for,
)
from k3deploy.tasks.transport.base import OutputCollector, brief, shell_command, with_timeout
from k3deploy.tasks.transport.ssh import SSHTransport

pytestmark = pytest.mark.transport


def test_shell_command_quotes_argv_and_keeps_strings():
    assert shell_command(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
    assert shell_command("echo $HOME | wc -c") == "echo $HOME | wc -c"
    with pytest.raises(ValueError):
        shell_command([])


def test_with_timeout_wraps_the_whole_command_as_one_word():
    wrapped = with_timeout(["echo", "it's; rm -rf /"], 2.5)
    argv = shlex.split(wrapped)
    assert argv[:5] == ["timeout", "-k", "3", "2.5", "sh"]
    assert argv[5:] == ["-c", "echo 'it'\"'\"'s; rm -rf /'"]
    out = subprocess.run(["bash", "-c", wrapped], capture_output=True, text=True, timeout=10)
    assert out.stdout == "it's; rm -rf /\n"
    with pytest.raises(ValueError):
        with_timeout("true", 0)


def test_collector_keeps_the_tail_and_says_so():
    seen: list[str] = []
    c = OutputCollector("h", lambda host, stream, line: seen.append(line), limit=10)
    c.feed("stdout", b"0123456789\nabc")
    c.feed("stdout", b"def\n")
    out, err = c.finish()
    assert seen == ["0123456789", "abcdef"]
    assert out == "[… output truncated, tail kept …]\n" + "0123456789\nabcdef\n"[-10:]
    assert err == ""


def test_local_runs_and_reports():
    result = LocalTransport("local0").run("echo out; echo err >&2; exit 4", 10)
    assert (result.host, result.exit_code, result.stdout, result.stderr) == ("local0", 4, "out\n", "err\n")
    with pytest.raises(CommandFailed, match=r"^local0: command exited 4"):
        result.check()


def test_local_timeout_kills_the_process_group():
    marker = f"{uuid.uuid4().int % 10**6 + 1000}"
    with pytest.raises(CommandTimeout, match=r"^local0: killed after 1s") as info:
        LocalTransport("local0").run(f"echo up; sleep {marker} & sleep {marker}", 1)
    assert info.value.stdout == "up\n"
    left = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True, text=True)
    assert left.stdout == ""


def test_fan_out_keeps_each_nodes_result_and_error():
    nodes = {"a": LocalTransport("a"), "b": LocalTransport("b")}
    results = run_all(nodes, {"a": "echo A", "b": "sleep 5"}, timeout=1)
    assert results["a"].stdout == "A\n"
    assert isinstance(results["b"], CommandTimeout) and results["b"].host == "b"


def test_stdin_reaches_the_command_and_ends():
    nodes = {"a": LocalTransport("a"), "b": LocalTransport("b")}
    results = run_all(nodes, "wc -c; cat", timeout=10, stdin={"a": b"secret-a", "b": b""})
    assert results["a"].stdout == "8\n" and results["b"].stdout == "0\n"
    assert "secret" not in results["a"].command  # what goes on stdin is never in the command line
    assert LocalTransport("c").run("cat", 10).stdout == ""  # no stdin: end-of-file at once, no hang


def test_fan_out_refuses_a_node_without_transport():
    with pytest.raises(ValueError, match="no transport for node"):
        run_all({"a": LocalTransport("a")}, {"z": "true"}, timeout=1)


def test_transports_follow_the_configuration():
    from k3deploy.blocks import parse_config
    from tests.configs import site_data

    cfg = parse_config(site_data())
    ssh = transports_for(cfg.cluster)
    assert list(ssh) == ["node0", "node1", "node2", "node3"]
    assert all(isinstance(t, SSHTransport) for t in ssh.values())
    assert ssh["node2"].address == "192.0.2.12" and ssh["node2"].host == "node2"
    data = site_data()
    data["cluster"]["transport"] = "local"
    local = transports_for(parse_config(data).cluster)
    assert all(isinstance(t, LocalTransport) for t in local.values())


# -- a connection dropped mid-command: run again only what is idempotent ----------------------------


class DropsThenAnswers:
    """A Transport whose connection drops during the first `drops` runs (as SSHTransport reports it)."""

    def __init__(self, host: str, drops: int, error: Exception | None = None) -> None:
        self.host, self.drops, self.error, self.runs = host, drops, error, 0

    def run(self, command, timeout, on_output=None, stdin=None) -> CommandResult:
        self.runs += 1
        if self.error is not None:
            raise self.error
        if self.runs <= self.drops:
            raise CommandInterrupted(self.host, command, f"EOF, after {self.runs}.0s")
        return CommandResult(self.host, command, 0, f"run {self.runs}\n", "", 0.01)

    def close(self) -> None: ...


def test_retry_policy_pauses_grow_and_are_bounded():
    assert list(RetryPolicy().pauses()) == [0.5, 1.0]
    assert list(RetryPolicy(attempts=4, first_pause_s=0.2, factor=3).pauses()) == pytest.approx([0.2, 0.6, 1.8])
    assert list(RetryPolicy(attempts=1).pauses()) == []
    for bad in ({"attempts": 0}, {"first_pause_s": -1}, {"factor": 0.5}):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


def test_idempotent_command_is_run_again_after_drops_and_each_retry_is_logged(caplog):
    node, pauses = DropsThenAnswers("node1", drops=2), []
    with caplog.at_level(logging.WARNING, logger="k3deploy.transport"):
        result = run_idempotent(node, "cat /etc/hccn.conf", 10, purpose="reading hccn.conf", sleep=pauses.append)
    assert (result.stdout, node.runs, pauses) == ("run 3\n", 3, [0.5, 1.0])
    assert [r.getMessage() for r in caplog.records] == [
        "node1: connection dropped while reading hccn.conf (attempt 1 of 3: EOF, after 1.0s); "
        "it only reads, so it runs again in 0.5s",
        "node1: connection dropped while reading hccn.conf (attempt 2 of 3: EOF, after 2.0s); "
        "it only reads, so it runs again in 1s",
    ]


def test_idempotent_command_gives_up_after_its_attempts_naming_node_and_purpose():
    node = DropsThenAnswers("node2", drops=99)
    with pytest.raises(CommandInterrupted) as info:
        run_idempotent(
            node, "npu-smi info", 10, purpose="reading npu-smi", policy=RetryPolicy(2, 0), sleep=lambda s: None
        )
    assert node.runs == 2
    assert str(info.value) == (
        "node2: connection dropped while reading npu-smi ('npu-smi info'), on each of 2 attempt(s), the last: "
        "EOF, after 2.0s; it only reads the node, but the connection kept dropping: gave up"
    )
    assert isinstance(info.value, ConnectionFault) and info.value.attempts == 2


@pytest.mark.parametrize(
    "error",
    [
        ConnectionFault("node0", "cannot reach 10.0.0.1:22 within 2s"),  # connecting was already retried with backoff
        CommandTimeout("node0", "killed on the node after 10s"),  # an answer: it ran too long
    ],
    ids=["unreachable", "timeout"],
)
def test_only_a_drop_mid_command_is_retried(error):
    node = DropsThenAnswers("node0", drops=0, error=error)
    with pytest.raises(type(error)) as info:
        run_idempotent(node, "true", 10, purpose="checking", sleep=lambda s: pytest.fail("no retry expected"))
    assert info.value is error and node.runs == 1


def test_command_that_changes_the_node_is_never_run_again_and_its_result_is_unknown():
    node = DropsThenAnswers("node3", drops=1)
    with pytest.raises(CommandInterrupted) as info:
        run_once(node, "docker run -d vllm", 10, purpose="starting the vLLM container")
    assert node.runs == 1
    assert str(info.value).startswith(
        "node3: connection dropped while starting the vLLM container ('docker run -d vllm'): EOF, after 1.0s; "
        "its result is unknown"
    )


def test_fan_out_retries_only_when_told_the_command_is_idempotent():
    def nodes() -> dict[str, DropsThenAnswers]:
        return {"a": DropsThenAnswers("a", drops=1), "b": DropsThenAnswers("b", drops=0)}

    once = nodes()
    results = run_all(once, "stat /srv/models", 10)
    assert isinstance(results["a"], CommandInterrupted) and results["b"].stdout == "run 1\n"  # type: ignore[union-attr]
    assert [t.runs for t in once.values()] == [1, 1]
    named = run_all(nodes(), "rm -rf /srv/models/x", 10, purpose="removing a checkpoint")
    assert "while removing a checkpoint (" in str(named["a"]) and "result is unknown" in str(named["a"])
    again = nodes()
    results = run_all(again, "stat /srv/models", 10, idempotent=True, purpose="reading the model root")
    assert {n: r.stdout for n, r in results.items()} == {"a": "run 2\n", "b": "run 1\n"}  # type: ignore[union-attr]
    assert [t.runs for t in again.values()] == [2, 1]


def test_local_transport_runs_an_idempotent_command_once_with_its_result(tmp_path: Path):
    log = tmp_path / "runs"
    command = f"echo ran >> {shlex.quote(str(log))}; wc -l < {shlex.quote(str(log))}"
    result = run_idempotent(LocalTransport("local0"), command, 10, purpose="counting")
    assert (result.host, result.stdout.strip()) == ("local0", "1")
    results = run_all({"l": LocalTransport("l")}, command, 10, idempotent=True, purpose="counting")
    assert results["l"].stdout.strip() == "2"  # type: ignore[union-attr]


def test_interrupted_survives_pickling_and_messages_stay_short():
    script = "T=abc\n" + "r 0 npu-smi info &\n" * 500
    err = CommandInterrupted("node1", script, "EOF, after 3.0s", purpose="running the comm checks")
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.host, back.purpose) == (CommandInterrupted, str(err), "node1", err.purpose)
    assert "('T=abc…')" in str(err) and len(str(err)) < 400  # a kilobyte script is named by its purpose
    assert brief("x" * 200) == "x" * 80 + "…" and brief("ls -l") == "ls -l"
