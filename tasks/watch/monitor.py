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
from k3deploy.tasks.watch.logwatch import LogBuffer, LogWatcher

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
            if event.kind == "fatal":
                cause = f"{event.id} {event.value}" if event.value else event.id  # e.g. cann_error_code EL0004
                reason = f"fatal log line {cause} ({event.why})" if event.why else f"fatal log line {cause}"
                self.fail(Failure(node, rank, reason, event.line, time.time(), emitted))

    def _wait_exit(self, node: str, rank: int, runtime: Runtime, handle: str) -> None:
        ended = runtime.wait_exit(handle, self._stopping)
        if ended is None or self._stopping.is_set():
            return
        self._log_threads[node].join(EXIT_LOG_GRACE_S)
        tail = " | ".join(self.buffers[node].tail(3))
        self.fail(Failure(node, rank, f"{ended} during {self.phase}", tail, time.time(), None))

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
