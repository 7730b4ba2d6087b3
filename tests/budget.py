"""The suite's cost, printed at its end: time by marker and the real vLLM starts the run made.

Every test's setup, call and teardown time is added to each of its markers (a test with several markers counts
in each, so the rows overlap; `all` is the whole). A real vLLM start is a process running the CPU vLLM
environment's own `vllm serve` (on this machine or in a bed container, which mounts it at the same path) whose
parent is not one: its forked engine processes and the stand-in (another program) are not counted. /proc is
read every second from a thread, and each start is known by its pid and start time; a start lives for tens of
seconds, so none is missed. Each start is put down to the test named in its own environment (pytest's
PYTEST_CURRENT_TEST, which the processes a test starts inherit), else to the tests running then. Both go to
test-artifacts/suite-budget.json for docs/BENCHMARKS.md.

Under pytest-xdist all of it happens once, in the controller: it sees every worker's reports (a test's markers
come with its report) and samples /proc for the whole machine.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from tests.vllm_env import VLLM

ARTIFACTS = Path(__file__).parents[1] / "test-artifacts"
SAMPLE_S = 1.0  # a real start lives 30 s or more before it is ready
NOT_MARKERS = {"parametrize", "usefixtures", "skipif", "skip", "xfail", "timeout", "filterwarnings"}

_seconds: dict[str, float] = defaultdict(float)
_markers: dict[str, set[str]] = {}
_registered: set[str] = set()


def plain_id(nodeid: str) -> str:
    """The test's id without pytest-xdist's `@group` suffix."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    _registered.update(line.split(":", 1)[0].split("(", 1)[0].strip() for line in config.getini("markers"))
    _registered.difference_update(NOT_MARKERS)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = plain_id(report.nodeid)
    _seconds[nodeid] += report.duration
    names = {k for k in report.keywords if k in _registered}
    _markers[nodeid] = names | {"all", "unit" if "/unit/" in nodeid else "integration"}


def _argv(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def is_vllm_serve(argv: list[str], program: str = str(VLLM)) -> bool:
    return any(a == program and argv[i + 1 : i + 2] == ["serve"] for i, a in enumerate(argv))


def serve_starts(program: str = str(VLLM)) -> set[tuple[str, str, bool]]:
    """(pid, start time, headless) of every `PROGRAM serve` process now running whose parent is not one."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or not is_vllm_serve(argv := _argv(proc.name), program):
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent, started = stat[1], stat[19]  # fields 4 and 22 of proc(5)
        if not is_vllm_serve(_argv(parent), program):
            found.add((proc.name, started, "--headless" in argv))
    return found


class StartCounter:
    """Samples /proc until stopped; `starts` holds every real vLLM start seen, `by_test` the test running
    when each server start was first seen (a module's shared server counts under its first test)."""

    def __init__(self) -> None:
        self.starts: set[tuple[str, str, bool]] = set()
        self.by_test: dict[str, int] = defaultdict(int)
        self.running: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-start-counter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            new = serve_starts() - self.starts
            self.starts |= new
            for pid, _, headless in new:
                if not headless:
                    self.by_test[started_by(pid) or " | ".join(self.running) or "(between tests)"] += 1

    def stop(self) -> tuple[int, int]:
        """(servers, ranks): starts of node 0's API server, and of every rank (headless ones too)."""
        self._stop.set()
        self._thread.join(timeout=30)
        return sum(1 for *_, headless in self.starts if not headless), len(self.starts)


def started_by(pid: str) -> str | None:
    """The test a process was started under, from the PYTEST_CURRENT_TEST it inherited."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith(b"PYTEST_CURRENT_TEST="):
            return plain_id(entry.split(b"=", 1)[1].decode(errors="replace").rsplit(" (", 1)[0])
    return None


_counter: StartCounter | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    global _counter
    if not is_worker(session.config):
        _counter = StartCounter()


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _counter is not None:
        _counter.running.append(plain_id(nodeid))


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _counter is not None and plain_id(nodeid) in _counter.running:
        _counter.running.remove(plain_id(nodeid))


def budget(seconds: dict[str, float], markers: dict[str, set[str]]) -> dict[str, dict[str, float]]:
    """Per marker: tests run and their seconds, slowest first."""
    rows: dict[str, dict[str, float]] = defaultdict(lambda: {"tests": 0, "seconds": 0.0})
    for nodeid, spent in seconds.items():
        for name in markers.get(nodeid, {"all"}):
            rows[name]["tests"] += 1
            rows[name]["seconds"] += spent
    return dict(sorted(rows.items(), key=lambda kv: -kv[1]["seconds"]))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not _seconds or is_worker(config):
        return
    rows = budget(_seconds, _markers)
    servers, ranks = _counter.stop() if _counter else (0, 0)
    terminalreporter.section("suite budget (seconds by marker; a test counts under each of its markers)")
    for name, row in rows.items():
        terminalreporter.write_line(f"{name:>12}  {row['seconds']:8.1f} s  {int(row['tests']):5d} tests")
    terminalreporter.write_line(f"real vLLM starts in this run: {servers} servers ({ranks} ranks with headless ones)")
    ARTIFACTS.mkdir(exist_ok=True)
    by_test = dict(sorted(_counter.by_test.items(), key=lambda kv: -kv[1])) if _counter else {}
    for nodeid, count in list(by_test.items())[:10]:
        terminalreporter.write_line(f"  {count:3d} started during {nodeid}")
    document = {"by_marker": rows, "vllm_starts": {"servers": servers, "ranks": ranks, "by_test": by_test},
                "tests": {k: round(v, 2) for k, v in sorted(_seconds.items(), key=lambda kv: -kv[1])}}  # fmt: skip
    (ARTIFACTS / "suite-budget.json").write_text(json.dumps(document, indent=1))
