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

    def clear(self, repo_id: str | None = None, path: str | None = None) -> None:
        """Clear every switch, or those of one repo, or of one file."""
        with self._lock:
            for key in list(self._by_file):
                if repo_id in (None, key[0]) and path in (None, key[1]):
                    del self._by_file[key]

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
