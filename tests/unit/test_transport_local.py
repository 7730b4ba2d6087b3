"""The local transport (the local profile's nodes) and the transport's pure pieces."""

from __future__ import annotations

import shlex
import subprocess
import uuid

import pytest

from k3deploy.errors import CommandFailed, CommandTimeout
from k3deploy.tasks.transport import LocalTransport, run_all, transports_for
from k3deploy.tasks.transport.base import OutputCollector, shell_command, with_timeout
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
