"""The part of the models stage that runs on a node, next to the disk: hash, verify, download.

Standard library only: the controller sends this file's source and the job (file list, URLs, auth
header) as JSON on stdin to a short `python3 -c` loader, so nothing is installed on the nodes and no
secret appears in a command line. Progress goes to stderr as `K3PROGRESS {json}`
lines; the result is one JSON object on the last stdout line.

Downloads are our own ranged GETs of the URLs the hub clients build: huggingface_hub 2.4 writes
each download to a process-unique temporary file and deletes it on failure, so an interrupted
1.49 TB download would start again from zero. Here a partial file survives a kill and the next
run continues it with a Range request, hashing as it writes, so a fresh download is verified
without a second read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CHUNK = 8 * 1024 * 1024  # hashlib releases the GIL on large updates: threads scale
NET_CHUNK = 1024 * 1024
MANIFEST_NAME = ".k3deploy-manifest.json"
PARTIAL_DIR = ".k3deploy-partial"
FORMAT = 1
PROGRESS = "K3PROGRESS "
PROGRESS_EVERY_S = 1.0


# ---- hashing ---------------------------------------------------------------------------------


def _new_hasher(expected: Any) -> Any:
    """sha256 for LFS files; the git blob id (sha1 over a header) for small files the hub lists so."""
    if expected.sha256:
        return hashlib.sha256()
    hasher = hashlib.sha1()
    hasher.update(f"blob {expected.size}\0".encode())
    return hasher


def _feed(path: Path, hasher: Any, on_bytes: Any = None, chunk: int = CHUNK) -> None:
    """Hash a file through one reused buffer: memory does not grow with file size."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buf):
            hasher.update(view[:n])
            if on_bytes:
                on_bytes(n)


def sha256_file(path: Path, chunk: int = CHUNK) -> str:
    hasher = hashlib.sha256()
    _feed(path, hasher, chunk=chunk)
    return hasher.hexdigest()


def _mismatch(expected: Any, actual: str) -> str:
    kind, want = ("sha256", expected.sha256) if expected.sha256 else ("git blob id", expected.git_blob)
    return "" if actual == want else f"{kind} {actual} does not match the hub's {want}"


@dataclass(frozen=True)
class FileCheck:
    path: str
    ok: bool
    problem: str = ""
    note: str = ""  # what happened on the way, for the stage's events (a download started again from byte 0)


def check_file(root: Path, expected: Any, on_bytes: Any = None) -> FileCheck:
    """Is `root/expected.path` the file the hub lists? Size first (cheap), then the checksum."""
    path = root / expected.path
    if not path.is_file():
        return FileCheck(expected.path, False, "missing")
    size = path.stat().st_size
    if size != expected.size:
        return FileCheck(expected.path, False, f"size {size} bytes, hub says {expected.size}")
    if not (expected.sha256 or expected.git_blob):
        return FileCheck(expected.path, False, "the hub lists no checksum for it")
    hasher = _new_hasher(expected)
    _feed(path, hasher, on_bytes)
    problem = _mismatch(expected, hasher.hexdigest())
    return FileCheck(expected.path, not problem, problem)


# ---- the manifest ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestEntry:
    size: int
    mtime_ns: int
    sha256: str | None
    git_blob: str | None
    verified_at: str


@dataclass
class Manifest:
    repo: str
    commit: str
    files: dict[str, ManifestEntry] = field(default_factory=dict)
    verify_seconds: float = 0.0
    format: int = FORMAT

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"total_bytes": self.total_bytes}, indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        data.pop("total_bytes", None)
        files = {path: ManifestEntry(**entry) for path, entry in data.pop("files").items()}
        return cls(files=files, **data)


def load_manifest(root: Path) -> Manifest | None:
    """The manifest beside a checkpoint, or None when absent or unreadable (then everything is hashed)."""
    try:
        manifest = Manifest.from_dict(json.loads((root / MANIFEST_NAME).read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return manifest if manifest.format == FORMAT else None


def write_manifest(root: Path, manifest: Manifest) -> None:
    tmp = root / f"{MANIFEST_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_text(manifest.to_json())
        os.replace(tmp, root / MANIFEST_NAME)  # never a half-written manifest
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no stray temporary file either
        raise


def try_write_manifest(root: Path, manifest: Manifest) -> str:
    """Write the manifest; on failure (a full disk) say why instead: the one on disk stays as it was, still true
    of the files it lists, and a file it misses is hashed again by the next verify."""
    try:
        write_manifest(root, manifest)
    except OSError as err:
        return f"cannot write the manifest {root / MANIFEST_NAME}: {err.strerror or err}"
    return ""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")  # noqa: UP017 - nodes may run Python < 3.11


def _entry(root: Path, expected: Any) -> ManifestEntry:
    st = (root / expected.path).stat()
    return ManifestEntry(st.st_size, st.st_mtime_ns, expected.sha256, expected.git_blob, _now())


def _vouched(root: Path, expected: Any, entry: ManifestEntry | None) -> bool:
    """Does the manifest vouch for the file: same expected checksum, size and mtime as when verified?"""
    if entry is None or (entry.sha256, entry.git_blob) != (expected.sha256, expected.git_blob):
        return False
    try:
        st = (root / expected.path).stat()
    except OSError:
        return False
    return st.st_size == entry.size == expected.size and st.st_mtime_ns == entry.mtime_ns


def verify_checkpoint(
    root: Path, listing: Any, previous: Manifest | None = None, threads: int = 2, on_bytes: Any = None
) -> tuple[list[FileCheck], Manifest, list[str]]:
    """Check every listed file; hash only those the previous manifest cannot vouch for.

    Returns the checks (listing order), the new manifest (verified files only) and the paths hashed.
    """
    started = time.perf_counter()
    old = previous.files if previous is not None else {}
    hashed: list[str] = []

    def one(expected: Any) -> tuple[FileCheck, ManifestEntry | None]:
        entry = old.get(expected.path)
        if entry is not None and _vouched(root, expected, entry):
            return FileCheck(expected.path, True), entry
        if (root / expected.path).is_file():
            hashed.append(expected.path)
        check = check_file(root, expected, on_bytes)
        return check, (_entry(root, expected) if check.ok else None)

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        outcomes = list(pool.map(one, listing.files))
    complete = all(check.ok for check, _ in outcomes)
    # The commit is the last one at which every file was verified here: a partial pass keeps the old one.
    manifest = Manifest(listing.repo, listing.commit if complete else (previous.commit if previous else ""))
    for expected, (_, entry) in zip(listing.files, outcomes):  # noqa: B905 - nodes may run Python < 3.10
        if entry is not None:
            manifest.files[expected.path] = entry
    manifest.verify_seconds = round(time.perf_counter() - started, 3)
    return [check for check, _ in outcomes], manifest, sorted(hashed)


# ---- progress --------------------------------------------------------------------------------


class Progress:
    """Counts bytes from many threads, and per source (the hub, a peer); a K3PROGRESS line at most once a second."""

    def __init__(self, op: str, total: int) -> None:
        self.op, self.total, self.done = op, total, 0
        self.sources: dict[str, int] = {}  # bytes received this run, by where they came from
        self._counted: dict[str, int] = {}  # bytes of each file counted as done
        self._lock = threading.Lock()
        self._last = 0.0

    def restart(self, file: str) -> None:
        """The file's partial went (its bytes failed the checksum): what was counted of it is not done."""
        with self._lock:
            self.done -= self._counted.pop(file, 0)

    def add(self, n: int, file: str = "", source: str | None = None) -> None:
        """`source` None: bytes already on the node (a resumed partial), counted as done but not as received;
        a partial resumed again in this run (another source) is not counted twice."""
        with self._lock:
            if source is None and file:
                n = max(0, n - self._counted.get(file, 0))
            self._counted[file] = self._counted.get(file, 0) + n
            self.done += n
            if source is not None:
                self.sources[source] = self.sources.get(source, 0) + n
            now = time.monotonic()
            if now - self._last < PROGRESS_EVERY_S and self.done < self.total:
                return
            self._last = now
            data = {"op": self.op, "done": self.done, "total": self.total, "file": file, "sources": self.sources}
            line = json.dumps(data)
        print(PROGRESS + line, file=sys.stderr, flush=True)


# ---- download --------------------------------------------------------------------------------


class FetchError(Exception):
    pass


class SlowSource(Exception):
    """A receiver's watch gave up on a source that sends too slowly: the partial stays for the next source."""


class DiskError(Exception):
    """Writing the partial file failed (a full disk, a quota, a read-only mount): retrying cannot help."""


SLOW = "slow: "  # a FileCheck problem that begins so: the watch left the source, the partial kept
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})  # a hub or CDN having a bad moment
BACKOFF_S, BACKOFF_MAX_S = 0.5, 10.0


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follow a hub's redirect (Hugging Face serves large files from another host) keeping Range, but never
    send the hub token to another host."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_Redirects)


def _open(url: str, headers: dict[str, str], start: int, timeout: float) -> Any:
    request = urllib.request.Request(url, headers={**headers, **({"Range": f"bytes={start}-"} if start else {})})
    return _OPENER.open(request, timeout=timeout)


def _is_timeout(err: BaseException) -> bool:
    reason = getattr(err, "reason", None)  # urlopen wraps a connect timeout in URLError
    return isinstance(err, socket.timeout) or isinstance(reason, socket.timeout)


def _describe(err: BaseException, read_timeout: float, who: str = "the hub") -> str:
    """What went wrong with the hub (or a peer), in words: the HTTP status, a read timeout, or the network error."""
    if isinstance(err, urllib.error.HTTPError):
        return f"{who} answered HTTP {err.code} {err.reason}"
    if _is_timeout(err):
        return f"{who} sent nothing for {read_timeout:g} s (read timeout)"
    if isinstance(err, urllib.error.URLError):
        return f"cannot reach {who}: {err.reason}"
    return f"{type(err).__name__}: {err}"


def _disk_problem(err: OSError, partial: Path, have: int, size: int) -> str:
    name = errno.errorcode.get(err.errno or 0, "")
    why = f"{err.strerror or err} ({name})" if name else f"{err.strerror or err}"
    return f"cannot write {partial}: {why}; {have} of {size} bytes kept there, the next run resumes from them"


@dataclass(frozen=True)
class Source:
    """Where one file's bytes come from: the hub (the job's URL and headers) or a peer (its URL, the run's token)."""

    name: str = "hub"
    url: str = ""
    headers: dict[str, str] | None = None
    retries: int | None = None  # None: the job's download_retries
    who: str = "the hub"
    read_timeout_s: float | None = None  # None: the job's read_timeout_s


HUB = Source()


def fetch_file(
    root: Path,
    expected: Any,
    job: dict[str, Any],
    progress: Progress,
    source: Source = HUB,
    watch: Callable[[int], None] | None = None,
) -> FileCheck:
    """Download one file into a partial that survives interruption, hashing as it arrives; move it in place.

    A network error, a read timeout (a stalled hub) or a transient HTTP status is retried with backoff,
    resuming with a Range request from the last byte written; the count of retries starts again whenever an
    attempt brought bytes. A local write error (ENOSPC) ends the file at once, its partial kept for a rerun,
    as is a partial whose source went away or that `watch` (told each chunk's bytes) found too slow: another
    source resumes it. Bytes that fail the checksum go.
    """
    partial = root / PARTIAL_DIR / (expected.path + ".part")
    hasher = _new_hasher(expected)
    have = partial.stat().st_size if partial.exists() else 0
    if have > expected.size:
        partial.unlink()
        have = 0
    if have:
        _feed(partial, hasher)  # resume: the bytes already here count towards the checksum
        progress.add(have, expected.path)
    retries = int(job.get("retries", 5)) if source.retries is None else source.retries
    kept = have  # bytes from before this call (another source, an earlier run): not this source's
    attempt, tries = 0, 0
    read_timeout = float(job.get("read_timeout_s", 60) if source.read_timeout_s is None else source.read_timeout_s)
    url = source.url or expected.url
    headers = job.get("headers", {}) if source.headers is None else source.headers
    while have < expected.size:
        before, tries = have, tries + 1
        try:
            with _open(url, headers, have, read_timeout) as response:
                if have and response.status != 206:  # the server ignored the range: start over
                    hasher, have, kept = _new_hasher(expected), 0, 0
                try:
                    partial.parent.mkdir(parents=True, exist_ok=True)
                    out = open(partial, "ab" if have else "wb", buffering=0)  # noqa: SIM115 - closed below
                except OSError as err:
                    raise DiskError(_disk_problem(err, partial, have, expected.size)) from err
                with out:
                    while chunk := response.read1(NET_CHUNK):  # what has arrived: a kill loses little
                        if have + len(chunk) > expected.size:
                            raise FetchError(f"{source.who} sent more than the {expected.size} bytes the hub lists")
                        view = memoryview(chunk)
                        while view:  # unbuffered: the file always holds exactly the `have` bytes hashed
                            try:
                                n = out.write(view)
                            except OSError as err:
                                raise DiskError(_disk_problem(err, partial, have, expected.size)) from err
                            hasher.update(view[:n])
                            have += n
                            progress.add(n, expected.path, source.name)
                            view = view[n:]
                        if watch is not None:
                            watch(len(chunk))
        except SlowSource as err:
            return FileCheck(expected.path, False, SLOW + str(err))
        except DiskError as err:
            return FileCheck(expected.path, False, str(err))
        except FetchError as err:
            partial.unlink(missing_ok=True)
            return FileCheck(expected.path, False, str(err))
        except (OSError, http.client.HTTPException) as err:
            status = getattr(err, "code", None)
            if have > before:
                attempt = 0  # this attempt made progress: a long download on a flaky link keeps going
            if (status is not None and status not in RETRY_STATUS) or attempt >= retries:
                where = f"at byte {have} of {expected.size}" if have else "before any byte"
                return FileCheck(
                    expected.path,
                    False,
                    f"download failed after {tries} attempt(s), {where}: {_describe(err, read_timeout, source.who)}",
                )
            attempt += 1
            time.sleep(min(BACKOFF_S * 2 ** (attempt - 1), BACKOFF_MAX_S))  # back off before resuming
            continue
        if have < expected.size:  # the connection closed early without an error: resume
            attempt = 0 if have > before else attempt + 1
            if attempt > retries:
                return FileCheck(expected.path, False, f"download stopped at {have} of {expected.size} bytes")
    problem = _mismatch(expected, hasher.hexdigest())
    if problem:
        partial.unlink()
        progress.restart(expected.path)
        if kept:  # the kept bytes and this source's rest fail together: which were bad is unknown, so no blame
            again = fetch_file(root, expected, job, progress, source, watch)  # once: the partial is gone now
            note = (f"the {kept} bytes kept from before and the rest from {source.who} failed the checksum "
                    f"({problem}); fetched again from byte 0 from {source.who}")  # fmt: skip
            return replace(again, note=note)
        origin = "" if source is HUB else f" (from {source.who})"
        return FileCheck(expected.path, False, f"downloaded file: {problem}{origin}")
    target = root / expected.path
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, target)
    except OSError as err:
        return FileCheck(expected.path, False, f"cannot move the downloaded file to {target}: {err}")
    return FileCheck(expected.path, True)


def prune_partials(root: Path) -> None:
    """Empty folders of the partial area go (deepest first); a partial kept for the next run keeps its own."""
    base = root / PARTIAL_DIR
    if not base.is_dir():
        return
    folders = sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for folder in [*folders, base]:
        with contextlib.suppress(OSError):  # not empty: a partial waits there
            folder.rmdir()


class Landing:
    """The manifest of a fetch in progress: bad copies removed first, each file recorded as it lands."""

    def __init__(self, root: Path, listing: Any, names: Any) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.listing = root, listing
        previous = load_manifest(root)
        self.manifest = Manifest(
            listing.repo, previous.commit if previous else "", dict(previous.files) if previous else {}
        )
        names = set(names)
        self.wanted = [f for f in listing.files if f.path in names]
        for expected in self.wanted:
            self.manifest.files.pop(expected.path, None)
            target = root / expected.path
            if target.exists():
                target.unlink()  # a bad or stale copy; the manifest no longer vouches for it
        self._lock = threading.Lock()

    def landed(self, expected: Any, check: FileCheck) -> FileCheck:
        if check.ok:
            with self._lock:
                self.manifest.files[expected.path] = _entry(self.root, expected)
                try_write_manifest(self.root, self.manifest)  # the last write (finish) says whether it could
        return check

    def finish(self, checks: list[FileCheck]) -> tuple[list[FileCheck], Manifest]:
        prune_partials(self.root)
        if all(f.path in self.manifest.files for f in self.listing.files):
            self.manifest.commit = self.listing.commit
        problem = try_write_manifest(self.root, self.manifest)
        if problem and all(c.ok for c in checks):  # else the files that failed (on that full disk) are the news
            raise OSError(problem)
        return checks, self.manifest


def fetch_files(root: Path, listing: Any, job: dict[str, Any]) -> tuple[list[FileCheck], Manifest, dict[str, Any]]:
    """Fetch the files the job names (replacing bad ones) from the hub, recording each in the manifest as it lands.

    Also returns what the result says of the fetch beyond checks and manifest: the bytes received, by source."""
    landing = Landing(root, listing, job["fetch"])
    progress = Progress("fetch", sum(f.size for f in landing.wanted))

    def one(expected: Any) -> FileCheck:
        return landing.landed(expected, fetch_file(root, expected, job, progress))

    with ThreadPoolExecutor(max_workers=max(1, int(job.get("threads", 2)))) as pool:
        checks = list(pool.map(one, landing.wanted))
    return (*landing.finish(checks), {"received": dict(progress.sources)})


# ---- the job ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    path: str
    size: int
    sha256: str | None
    git_blob: str | None
    url: str = ""


@dataclass(frozen=True)
class JobListing:
    repo: str
    commit: str
    files: tuple[Expected, ...]


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _free_bytes(root: Path) -> tuple[int, int]:
    """Free bytes and device id of the filesystem `root` is (or will be) on."""
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize, probe.stat().st_dev


def _stat_state(root: Path, listing: JobListing) -> dict[str, Any]:
    """Sizes and mtimes (a fingerprint for caching), bytes still missing, free space: no hashing."""
    entries, missing = [], 0
    for f in listing.files:
        try:
            st = (root / f.path).stat()
            entries.append([f.path, st.st_size, st.st_mtime_ns])
            missing += 0 if st.st_size == f.size else f.size
        except OSError:
            entries.append([f.path, None, None])
            missing += f.size - _size(root / PARTIAL_DIR / (f.path + ".part"))
    # What the manifest vouches for is part of the fingerprint (not when it was written): a missing, changed or
    # unreadable manifest is never answered from the verification cache.
    manifest = load_manifest(root)
    vouches = None
    if manifest is not None:
        vouches = [
            manifest.commit,
            sorted((p, e.size, e.mtime_ns, e.sha256, e.git_blob) for p, e in manifest.files.items()),
        ]
    fingerprint = hashlib.sha256(json.dumps([listing.commit, entries, vouches]).encode()).hexdigest()
    free, device = _free_bytes(root)
    return {"fingerprint": fingerprint, "missing_bytes": missing, "free_bytes": free, "device": device}


def _documents(root: Path, names: list[str], limit: int = 1024 * 1024) -> dict[str, str]:
    """Small text files the controller checks (config.json, quantization description)."""
    out = {}
    for name in names:
        path = root / name
        if path.is_file() and path.stat().st_size <= limit:
            out[name] = path.read_text(errors="replace")
    return out


Fetcher = Callable[[Path, JobListing, dict[str, Any]], tuple[list[FileCheck], Manifest, dict[str, Any]]]


def run_job(job: dict[str, Any], exchange: Fetcher | None = None) -> dict[str, Any]:
    """`exchange`: the peer exchange's fetch (node_exchange), which the loader passes in when it sends that too."""
    root = Path(job["root"])
    listing = JobListing(job["repo"], job["commit"], tuple(Expected(**f) for f in job["files"]))
    result: dict[str, Any] = {"op": job["op"]}
    if job["op"] == "verify":
        previous = load_manifest(root)
        vouching = None if job.get("full") else previous  # a full verify hashes every file whatever it says
        progress = Progress("verify", sum(f.size for f in listing.files))
        checks, manifest, hashed = verify_checkpoint(root, listing, vouching, int(job.get("threads", 2)), progress.add)
        if root.is_dir():
            try_write_manifest(root, manifest)  # a cache: a full disk must not hide what was verified
        result |= {"hashed": hashed, "previous_commit": previous.commit if previous else None}
    elif job["op"] == "fetch":
        checks, manifest, extra = fetch_files(root, listing, job)
        result |= extra
    elif job["op"] == "exchange" and exchange is not None:
        checks, manifest, extra = exchange(root, listing, job)
        result |= extra
    elif job["op"] != "stat":
        raise ValueError(f"unknown op {job['op']!r}")
    if job["op"] != "stat":
        result |= {
            "checks": [asdict(c) for c in checks],
            "manifest": asdict(manifest),
            "documents": _documents(root, job.get("read", [])),
        }
    return result | _stat_state(root, listing)


def main(raw: bytes, exchange: Fetcher | None = None) -> int:
    job = json.loads(raw)
    try:
        result = run_job(job, exchange)
    except OSError as err:
        result = {"op": job.get("op"), "error": f"{type(err).__name__}: {err}"}
    print(json.dumps(result), flush=True)
    return 0 if "error" not in result else 1
