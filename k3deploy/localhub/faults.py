"""Fault switches and the request log of the local model hub.

Faults are keyed by (repo id, file path) and apply to every revision of that file, on both
the HF and the ModelScope routes, until cleared:

- ``corrupt``: serve different bytes of the same size (every byte inverted) while all metadata
  keeps the true sha256 — what a bad mirror or disk does; HF accepts it, ModelScope rejects it.
- ``drop_hash``: the sha256 appears nowhere: no HF ``lfs`` block or ``X-Linked-Etag`` (the ETag
  becomes the git blob id), ModelScope ``Sha256`` is empty and no ``X-Linked-ETag`` is sent.
- ``truncate``: a GET whose byte range crosses absolute offset ``at`` sends the bytes before
  ``at`` and then closes the connection (headers still announce the full length). ``times``
  limits how many responses are cut (``None``: all, so a resume from ``at`` gets no byte).
- ``slow``: pace the body to ``rate`` bytes per second.
- ``fail``: the next ``times`` GETs of the file (``None``: every one) answer HTTP ``status`` (a 500 or 503, say)
  with no file bytes — a hub or CDN having a bad moment.
- ``stall``: a GET whose byte range starts before absolute offset ``at`` and reaches it sends the bytes
  before ``at`` and then nothing, keeping the connection open, for ``seconds`` (``None``: until the switch is
  cleared or the hub stops); then it sends the rest, if the client is still there. ``times`` limits how many
  responses stall (``None``: all); a resume from ``at`` on is never stalled, as after a real hiccup.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class FileFaults:
    """The switches set for one file."""

    corrupt: bool = False
    drop_hash: bool = False
    truncate_at: int | None = None
    truncate_times: int | None = None  # None with truncate_at set: cut every response
    rate: int | None = None
    fail_status: int | None = None
    fail_times: int | None = None  # None with fail_status set: fail every GET
    stall_at: int | None = None
    stall_seconds: float | None = None  # None: until cleared
    stall_times: int | None = None  # None with stall_at set: stall every response crossing stall_at


@dataclass(frozen=True)
class Stall:
    """A response that must stop sending at `at` until `released` is set or `seconds` pass (None: no limit)."""

    at: int
    seconds: float | None
    released: threading.Event


@dataclass(frozen=True)
class RequestRecord:
    """One request the hub answered, for tests to assert on (e.g. that a resume sent Range)."""

    method: str
    path: str
    range: str | None
    status: int
    sent: int  # body bytes written
    authorized: bool = False  # the request carried an Authorization header (a token)


class Faults:
    """Thread-safe registry of fault switches; the handler consults it for every file it serves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_file: dict[tuple[str, str], FileFaults] = {}
        self._stalled: dict[tuple[str, str], list[threading.Event]] = {}  # responses stalled now, by file

    def _update(self, repo_id: str, path: str, **changes: Any) -> None:
        with self._lock:
            current = self._by_file.get((repo_id, path), FileFaults())
            self._by_file[(repo_id, path)] = replace(current, **changes)

    def corrupt(self, repo_id: str, path: str) -> None:
        """Serve inverted bytes of the same size; metadata keeps the true sha256."""
        self._update(repo_id, path, corrupt=True)

    def drop_hash(self, repo_id: str, path: str) -> None:
        """Leave the file's sha256 out of every listing and header."""
        self._update(repo_id, path, drop_hash=True)

    def truncate(self, repo_id: str, path: str, at: int, times: int | None = 1) -> None:
        """Cut the next `times` transfers crossing byte offset `at` (None: every one)."""
        if at < 0 or (times is not None and times < 1):
            raise ValueError("truncate needs at >= 0 and times >= 1 or None")
        self._update(repo_id, path, truncate_at=at, truncate_times=times)

    def slow(self, repo_id: str, path: str, rate: int) -> None:
        """Send the file at `rate` bytes per second."""
        if rate < 1:
            raise ValueError("rate must be >= 1 byte/s")
        self._update(repo_id, path, rate=rate)

    def fail(self, repo_id: str, path: str, status: int = 503, times: int | None = 1) -> None:
        """Answer the next `times` GETs of the file (None: every one) with HTTP `status` and no file bytes."""
        if not 400 <= status <= 599 or (times is not None and times < 1):
            raise ValueError("fail needs a 4xx or 5xx status and times >= 1 or None")
        self._update(repo_id, path, fail_status=status, fail_times=times)

    def stall(self, repo_id: str, path: str, at: int, seconds: float | None = None, times: int | None = 1) -> None:
        """Stop the next `times` transfers crossing byte `at` there, connection open, for `seconds` (None: until
        cleared); then send the rest."""
        if at < 1 or (seconds is not None and seconds <= 0) or (times is not None and times < 1):
            raise ValueError("stall needs at >= 1, seconds > 0 or None, and times >= 1 or None")
        self._update(repo_id, path, stall_at=at, stall_seconds=seconds, stall_times=times)

    def clear(self, repo_id: str | None = None, path: str | None = None) -> None:
        """Clear every switch, or those of one repo, or of one file; stalled responses of those files go on."""
        with self._lock:
            for key in list(self._by_file):
                if repo_id in (None, key[0]) and path in (None, key[1]):
                    del self._by_file[key]
            for key, events in self._stalled.items():
                if repo_id in (None, key[0]) and path in (None, key[1]):
                    for event in events:
                        event.set()

    def release_stalls(self) -> None:
        """Let every stalled response go on (the hub is stopping); the switches stay set."""
        with self._lock:
            for events in self._stalled.values():
                for event in events:
                    event.set()

    def stalled(self, repo_id: str | None = None, path: str | None = None) -> int:
        """How many responses (of a repo, of a file) are stalled now: tests wait for this, not for time."""
        with self._lock:
            return sum(
                sum(not e.is_set() for e in events)
                for (r, p), events in self._stalled.items()
                if repo_id in (None, r) and path in (None, p)
            )

    def get(self, repo_id: str, path: str) -> FileFaults:
        """Switches currently set for a file (all off if none)."""
        with self._lock:
            return self._by_file.get((repo_id, path), FileFaults())

    def take_cut(self, repo_id: str, path: str, start: int, end: int) -> int | None:
        """Offset at which a response for bytes start..end must stop, consuming one `times`."""
        with self._lock:
            current = self._by_file.get((repo_id, path))
            at = current.truncate_at if current else None
            if current is None or at is None or not start <= at <= end:
                return None
            if current.truncate_times is not None:
                left = current.truncate_times - 1
                self._by_file[(repo_id, path)] = replace(
                    current, truncate_at=at if left else None, truncate_times=left or None
                )
            return at

    def take_failure(self, repo_id: str, path: str) -> int | None:
        """The status a GET of the file must answer instead of the file, consuming one `times`; None: serve it."""
        with self._lock:
            current = self._by_file.get((repo_id, path))
            if current is None or current.fail_status is None:
                return None
            status = current.fail_status
            if current.fail_times is not None:
                left = current.fail_times - 1
                self._by_file[(repo_id, path)] = replace(
                    current, fail_status=status if left else None, fail_times=left or None
                )
            return status

    def take_stall(self, repo_id: str, path: str, start: int, end: int) -> Stall | None:
        """Where a response for bytes start..end must stall (start < at <= end), consuming one `times`; None: it
        does not."""
        with self._lock:
            current = self._by_file.get((repo_id, path))
            at = current.stall_at if current else None
            if current is None or at is None or not start < at <= end:
                return None
            if current.stall_times is not None:
                left = current.stall_times - 1
                self._by_file[(repo_id, path)] = replace(
                    current,
                    stall_at=at if left else None,
                    stall_seconds=current.stall_seconds if left else None,
                    stall_times=left or None,
                )
            released = threading.Event()
            self._stalled.setdefault((repo_id, path), []).append(released)
            return Stall(at, current.stall_seconds, released)

    def wait_stall(self, repo_id: str, path: str, stall: Stall) -> None:
        """Block the response's thread until the stall is released or its seconds pass."""
        stall.released.wait(stall.seconds)
        with self._lock:
            events = self._stalled.get((repo_id, path), [])
            if stall.released in events:
                events.remove(stall.released)
            if not events:
                self._stalled.pop((repo_id, path), None)

    def apply(self, spec: dict[str, Any]) -> None:
        """Set a switch from the admin endpoint's JSON: {"kind", "repo", "path", ...}."""
        kind, repo_id, path = spec["kind"], spec["repo"], spec["path"]
        if kind == "corrupt":
            self.corrupt(repo_id, path)
        elif kind == "drop_hash":
            self.drop_hash(repo_id, path)
        elif kind == "truncate":
            self.truncate(repo_id, path, int(spec["at"]), spec.get("times", 1))
        elif kind == "slow":
            self.slow(repo_id, path, int(spec["rate"]))
        elif kind == "fail":
            self.fail(repo_id, path, int(spec.get("status", 503)), spec.get("times", 1))
        elif kind == "stall":
            seconds = None if spec.get("seconds") is None else float(spec["seconds"])
            self.stall(repo_id, path, int(spec["at"]), seconds, spec.get("times", 1))
        else:
            raise ValueError(f"unknown fault kind {kind!r}")

    def as_json(self) -> list[dict[str, Any]]:
        """All switches, for GET /_admin/faults."""
        with self._lock:
            return [{"repo": r, "path": p, **asdict(f)} for (r, p), f in sorted(self._by_file.items())]


@dataclass
class RequestLog:
    """Append-only log of answered requests."""

    records: list[RequestRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, record: RequestRecord) -> None:
        """Record one answered request."""
        with self._lock:
            self.records.append(record)

    def snapshot(self) -> list[RequestRecord]:
        """A copy, safe to iterate while the server keeps serving."""
        with self._lock:
            return list(self.records)

    def clear(self) -> None:
        """Forget what was logged so far."""
        with self._lock:
            self.records.clear()
