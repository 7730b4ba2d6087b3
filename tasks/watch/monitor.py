"""Watching the servers: every log line through the watcher, every exit noticed.

One thread per node follows its server's log (through its runtime: docker logs, or the process's
log file) and one waits for it to exit; the first fatal line or exit sets `failed`, which the
readiness loop (launch) or the stage using the service (liveness) waits on, so a failure is seen
as soon as its line arrives, not at the next poll.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from k3deploy.tasks.runtime import Runtime
from k3deploy.tasks.watch.cause import failure_class, find_cause
from k3deploy.tasks.watch.logwatch import LogBuffer, LogEvent, LogWatcher, strip_ansi

MAX_PARTIAL = 64 * 1024  # a "line" longer than this is cut: memory stays bounded
EXIT_LOG_GRACE_S = 2.0  # after an exit, let the log thread read the last lines (they name the cause)
STOP_JOIN_S = 15.0  # longest stop() waits for the followers it stops on the nodes


@dataclass(frozen=True)
class Failure:
    """Why the launch failed: the node, its DP rank, what happened and the log line that says so."""

    node: str
    rank: int
    reason: str
    line: str | None
    seen_at: float  # time.time() when this machine saw it
    emitted_at: float | None  # the engine's timestamp of the line, when there is one
    log_line: int | None = None  # where `line` is in the node's log (1-based), when it is the log's
    failure_class: str | None = None  # whose problem, when the line says (its family, or what raised it)
    family: str | None = None  # the kind of failure, when a fatal pattern knows the line

    def describe(self) -> str:
        where = f"{self.node} (DP rank {self.rank})"
        return f"{where}: {self.reason}" + (f": {self.line}" if self.line else "")


def split_timestamp(line: str) -> tuple[float | None, str]:
    """'2026-11-30T10:00:00.123456789Z text' (docker logs --timestamps) → (epoch seconds, text)."""
    stamp, sep, text = line.partition(" ")
    if not sep or not stamp[:4].isdigit():
        return None, line
    try:
        head, _, frac = stamp.rstrip("Z").partition(".")
        seconds = datetime.fromisoformat(head + "+00:00").timestamp()
        return seconds + (float(f"0.{frac[:6]}") if frac else 0.0), text
    except ValueError:
        return None, line


class LaunchMonitor:
    """Follows every server of a run; `failed` is set by the first fatal line, exit or `fail()`.

    `phase` says what was going on in an exit's reason ("during launch", "during bench");
    each node's log is written to `log_dir/<node><log_suffix>.log`.
    """

    def __init__(
        self, watcher: LogWatcher, log_dir: Path, max_lines: int = 2000, phase: str = "launch", log_suffix: str = ""
    ) -> None:
        self.watcher, self.log_dir, self.max_lines = watcher, log_dir, max_lines
        self.phase, self.log_suffix = phase, log_suffix
        self.failed = threading.Event()
        self.failure: Failure | None = None
        self.buffers: dict[str, LogBuffer] = {}
        self.ranks: dict[str, int] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._log_threads: dict[str, threading.Thread] = {}
        self._joined: list[threading.Thread] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def fail(self, failure: Failure) -> None:
        """Record the first failure (any later one is dropped) and wake whoever waits on `failed`."""
        with self._lock:
            if self.failure is None and not self._stopping.is_set():
                self.failure = failure
                self.failed.set()

    def follow(self, node: str, rank: int, runtime: Runtime, handle: str) -> None:
        self.ranks[node] = rank
        self.buffers[node] = LogBuffer(self.max_lines, self.log_dir / f"{node}{self.log_suffix}.log")
        logs = threading.Thread(target=self._follow_logs, args=(node, rank, runtime, handle), daemon=True)
        waits = threading.Thread(target=self._wait_exit, args=(node, rank, runtime, handle), daemon=True)
        self._log_threads[node] = logs
        if runtime.follow_ends_on_stop:
            self._joined += [logs, waits]
        logs.start()
        waits.start()

    def _follow_logs(self, node: str, rank: int, runtime: Runtime, handle: str) -> None:
        partial = b""
        for chunk in runtime.log_chunks(handle, self._stopping):
            *lines, partial = (partial + chunk).split(b"\n")
            partial = partial[-MAX_PARTIAL:]
            for raw in lines:
                self._line(node, rank, raw.decode(errors="replace").rstrip("\r"))
        if partial:
            self._line(node, rank, partial.decode(errors="replace"))

    def _line(self, node: str, rank: int, line: str) -> None:
        emitted, text = split_timestamp(line)
        self.buffers[node].append(text)
        for event in self.watcher.feed(node, rank, text):
            if event.kind != "fatal":
                continue
            pattern = self.watcher.patterns.by_id[event.id]
            if pattern.consequence:  # its cause is in the lines before it, or just after (a traceback)
                timer = threading.Timer(EXIT_LOG_GRACE_S, self._fail_at_consequence, (node, rank, event, emitted))
                timer.daemon = True
                timer.start()
            else:  # the line is a cause: named at once, where it is in the log
                number = self.buffers[node].lines_seen
                self.fail(Failure(node, rank, event_reason(event), event.line, time.time(), emitted, number,
                                  pattern.failure_class, pattern.family))  # fmt: skip

    def _fail_at_consequence(self, node: str, rank: int, event: LogEvent, emitted: float | None) -> None:
        """A consequence's failure names the cause its burst of the log holds (tasks/watch/cause.py)."""
        named = self._from_log(node, rank, event_reason(event), emitted)
        self.fail(named or Failure(node, rank, event_reason(event), event.line, time.time(), emitted))

    def cause_in_logs(self, what: str) -> Failure | None:
        """The first node's (in the order followed) cause line, with `what` as the reason no family gives: for a
        launch that timed out, the engine's own words if any rank has some."""
        for node, rank in self.ranks.items():
            found = self._from_log(node, rank, what)
            if found is not None:
                return found
        return None

    def _from_log(self, node: str, rank: int, what: str, emitted: float | None = None) -> Failure | None:
        """The failure named by the cause line of the node's log (tasks/watch/cause.py), if the log has one: the
        reason is its family's why when a family knows it, else `what`."""
        first, lines = self.buffers[node].numbered()
        cause = find_cause(lines, self.watcher.patterns)
        if cause is None:
            return None
        named, text = cause.pattern, cause.text()
        found = named.regex.search(strip_ansi(text)) if named is not None else None
        reason = fatal_reason(named.id, named.value(found), named.why) if named and found else what
        return Failure(node, rank, reason, text, time.time(), emitted, first + cause.number - 1,
                       failure_class(cause), named.family if named is not None else None)  # fmt: skip

    def _wait_exit(self, node: str, rank: int, runtime: Runtime, handle: str) -> None:
        ended = runtime.wait_exit(handle, self._stopping)
        if ended is None or self._stopping.is_set():
            return
        self._log_threads[node].join(EXIT_LOG_GRACE_S)
        what = f"{ended} during {self.phase}"
        self.fail(self._from_log(node, rank, what) or Failure(node, rank, what, None, time.time(), None))

    def stop(self) -> None:
        """Stop reporting. Followers that end on stop (a process's tail and exit wait, stopped on the node) are
        waited for, so that nothing of them is left there once the caller closes its connections; the others
        end when their streams close."""
        self._stopping.set()
        deadline = time.monotonic() + STOP_JOIN_S
        for thread in self._joined:
            thread.join(max(0.0, deadline - time.monotonic()))
        for buffer in self.buffers.values():
            with contextlib.suppress(OSError):
                buffer.close()


def fatal_reason(ident: str, value: str | None, why: str | None) -> str:
    """'fatal log line cann_error_code EL0004 (why)': the pattern, its captured value and its why."""
    cause = f"{ident} {value}" if value else ident
    return f"fatal log line {cause} ({why})" if why else f"fatal log line {cause}"


def event_reason(event: LogEvent) -> str:
    return fatal_reason(event.id, event.value, event.why)
