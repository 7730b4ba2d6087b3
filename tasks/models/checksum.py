"""Hash files with bounded memory and check them against the hub's listing.

huggingface_hub never checks sha256 of what it downloads, and ModelScope re-hashes every cached
file on every call: this is the one check the pipeline trusts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tasks.models.listing import RemoteFile

CHUNK = 8 * 1024 * 1024  # hashlib releases the GIL on large updates: threads scale


def _digest(path: Path, hasher: hashlib._Hash, chunk: int = CHUNK) -> str:  # type: ignore[name-defined]
    buf = bytearray(chunk)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buf):
            hasher.update(view[:n])
    return hasher.hexdigest()


def sha256_file(path: Path, chunk: int = CHUNK) -> str:
    """sha256 of a file, reading into one reused buffer (memory does not grow with file size)."""
    return _digest(path, hashlib.sha256(), chunk)


def git_blob_sha1(path: Path) -> str:
    """The git blob id the hub gives small (non-LFS) files instead of a sha256."""
    hasher = hashlib.sha1()
    hasher.update(f"blob {path.stat().st_size}\0".encode())
    return _digest(path, hasher)


@dataclass(frozen=True)
class FileCheck:
    path: str
    ok: bool
    problem: str = ""


def check_file(root: Path, remote: RemoteFile) -> FileCheck:
    """Is `root/remote.path` the file the hub lists? Size first (cheap), then the checksum."""
    path = root / remote.path
    if not path.is_file():
        return FileCheck(remote.path, False, "missing")
    size = path.stat().st_size
    if size != remote.size:
        return FileCheck(remote.path, False, f"size {size} bytes, hub says {remote.size}")
    if remote.sha256:
        actual, expected, kind = sha256_file(path), remote.sha256, "sha256"
    elif remote.git_blob:
        actual, expected, kind = git_blob_sha1(path), remote.git_blob, "git blob id"
    else:
        return FileCheck(remote.path, False, "the hub lists no checksum for it")
    if actual != expected:
        return FileCheck(remote.path, False, f"{kind} {actual} does not match the hub's {expected}")
    return FileCheck(remote.path, True)
