"""The suite's own budget report: time by marker, and real vLLM starts told apart from their engines' forks."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.budget import budget, is_vllm_serve, plain_id, serve_starts, started_by
from tests.prefect_runs import wait_for

pytestmark = pytest.mark.bed

FAKE = "/nonexistent/envs/vllm-cpu-test/bin/vllm"  # not the suite's real environment: its own count stays true


def test_time_is_added_to_each_marker_of_a_test():
    rows = budget({"a": 2.0, "b": 3.0}, {"a": {"all", "vllm", "bench"}, "b": {"all", "bench"}})
    assert rows["all"] == {"tests": 2, "seconds": 5.0} and rows["bench"] == {"tests": 2, "seconds": 5.0}
    assert rows["vllm"] == {"tests": 1, "seconds": 2.0} and list(rows)[-1] == "vllm"  # slowest first


@pytest.mark.parametrize(
    ("argv", "serves"),
    [([f"{FAKE[:-4]}python3", FAKE, "serve", "/m"], True), (["python3", "vllm_standin.py", "serve"], False),
     ([FAKE, "bench", "serve"], False), ([FAKE], False), (["sh", "-c", "x", FAKE, "serve"], True)],
)  # fmt: skip
def test_a_start_is_the_environment_s_own_vllm_serve(argv, serves):
    assert is_vllm_serve(argv, FAKE) is serves


def test_a_server_and_its_fork_are_one_start():
    """A subshell is a fork with its parent's argv, as vLLM's forked engine processes are."""
    proc = subprocess.Popen(["sh", "-c", "(read x; :) & read y; wait", FAKE, "serve"], stdin=subprocess.PIPE)
    try:
        # until the fork is there to be left out (both read stdin: neither ends first)
        forks = wait_for("the subshell", lambda: subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                                text=True).stdout.split(), timeout=30)  # fmt: skip
        starts = serve_starts(FAKE)
        assert forks and [pid for pid, _, _ in starts] == [str(proc.pid)], (starts, forks)
        assert serve_starts(FAKE) == starts  # the same start, seen again
    finally:
        proc.communicate(b"\n\n", timeout=30)


@pytest.mark.parametrize(
    ("nodeid", "test"),
    [("tests/a.py::t@local", "tests/a.py::t"), ("tests/a.py::t[x@y]", "tests/a.py::t[x@y]"),
     ("tests/a.py::t[x@y]@bed", "tests/a.py::t[x@y]"), ("tests/a.py::t", "tests/a.py::t")],
)  # fmt: skip
def test_a_test_is_known_by_its_id_without_xdist_s_group(nodeid, test):
    assert plain_id(nodeid) == test


def execed(proc: subprocess.Popen[bytes]) -> str:
    """The child's pid once it runs `sh` (until then /proc shows the forked parent's environment), bounded."""
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] != b"sh":
        assert time.monotonic() < deadline, "the child never exec'd sh"
        time.sleep(0.01)  # a state of another process: nothing to wait on but /proc
    return str(proc.pid)


def test_a_start_is_put_down_to_the_test_in_its_environment():
    env = {"PYTEST_CURRENT_TEST": "tests/integration/test_x.py::test_y@local (call)", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE, env=env)
    try:
        assert started_by(execed(proc)) == "tests/integration/test_x.py::test_y"
    finally:
        proc.communicate(b"\n", timeout=30)
    bare = subprocess.Popen(["sh", "-c", "read x"], stdin=subprocess.PIPE, env={"PATH": "/usr/bin:/bin"})
    try:
        assert started_by(execed(bare)) is None
    finally:
        bare.communicate(b"\n", timeout=30)
