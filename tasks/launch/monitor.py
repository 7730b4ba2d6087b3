"""Watching the containers while they start: every log line through the watcher, every exit noticed.

One thread per container follows its log (docker logs, timestamps on) and one waits for it to
exit; the first fatal line or exit sets `failed`, which the readiness loop waits on, so a failure
is seen as soon as its line arrives rather than at the next readiness poll.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import docker.errors
import requests

from k3deploy.tasks.launch.logwatch import LogBuffer, LogWatcher

MAX_PARTIAL = 64 * 1024  # a "line" longer than this is cut: memory stays bounded
EXIT_LOG_GRACE_S = 2.0  # after an exit, let the log thread read the last lines (they name the cause)


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
    """Follows every container of a launch; `failed` is set by the first fatal line or exit."""

    def __init__(self, watcher: LogWatcher, log_dir: Path, max_lines: int = 2000) -> None:
        self.watcher, self.log_dir, self.max_lines = watcher, log_dir, max_lines
        self.failed = threading.Event()
        self.failure: Failure | None = None
        self.buffers: dict[str, LogBuffer] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._log_threads: dict[str, threading.Thread] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def _fail(self, failure: Failure) -> None:
        with self._lock:
            if self.failure is None and not self._stopping.is_set():
                self.failure = failure
                self.failed.set()

    def follow(self, node: str, rank: int, client: Any, container_id: str) -> None:
        self.buffers[node] = LogBuffer(self.max_lines, self.log_dir / f"{node}.log")
        logs = threading.Thread(target=self._follow_logs, args=(node, rank, client, container_id), daemon=True)
        waits = threading.Thread(target=self._wait_exit, args=(node, rank, client, container_id), daemon=True)
        self._log_threads[node] = logs
        logs.start()
        waits.start()

    def _chunks(self, client: Any, container_id: str) -> Iterator[bytes]:
        """The log stream, picked up again after a read timeout (a quiet two-hour load is normal)."""
        since: int | None = None
        while not self._stopping.is_set():
            try:
                yield from client.api.logs(container_id, stream=True, follow=True, timestamps=True, since=since)
                return
            except requests.exceptions.RequestException:
                since = int(time.time()) - 1  # may repeat a line of the last second; the watcher tolerates it
            except (docker.errors.NotFound, OSError):
                return

    def _follow_logs(self, node: str, rank: int, client: Any, container_id: str) -> None:
        partial = b""
        for chunk in self._chunks(client, container_id):
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
                reason = f"fatal log line ({event.why})" if event.why else "fatal log line"
                self._fail(Failure(node, rank, reason, event.line, time.time(), emitted))

    def _wait_exit(self, node: str, rank: int, client: Any, container_id: str) -> None:
        while not self._stopping.is_set():
            try:
                status = client.api.wait(container_id, timeout=60)
            except requests.exceptions.RequestException:
                continue  # a read timeout while it runs (or the connection closing at stop): ask again
            except (docker.errors.NotFound, OSError):
                status = {"StatusCode": "gone (removed)"}
            if self._stopping.is_set():
                return
            self._log_threads[node].join(EXIT_LOG_GRACE_S)
            tail = " | ".join(self.buffers[node].tail(3))
            code = status.get("StatusCode")
            self._fail(
                Failure(node, rank, f"the container exited (status {code}) during launch", tail, time.time(), None)
            )
            return

    def stop(self) -> None:
        """Stop reporting; the threads end when their streams close (teardown) or at the next timeout."""
        self._stopping.set()
        for buffer in self.buffers.values():
            with contextlib.suppress(OSError):
                buffer.close()
