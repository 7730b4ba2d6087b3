"""The manifest beside each checkpoint: what was verified, so a rerun re-hashes only what changed."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tasks.models.checksum import FileCheck, check_file
from tasks.models.listing import Listing, RemoteFile

MANIFEST_NAME = ".k3deploy-manifest.json"
FORMAT = 1


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
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        data.pop("total_bytes", None)
        files = {path: ManifestEntry(**entry) for path, entry in data.pop("files").items()}
        return cls(files=files, **data)


def load_manifest(root: Path) -> Manifest | None:
    """The manifest beside a checkpoint, or None when absent or unreadable (then everything is hashed)."""
    try:
        manifest = Manifest.from_json((root / MANIFEST_NAME).read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return manifest if manifest.format == FORMAT else None


def write_manifest(root: Path, manifest: Manifest) -> None:
    tmp = root / f"{MANIFEST_NAME}.tmp"
    tmp.write_text(manifest.to_json())
    os.replace(tmp, root / MANIFEST_NAME)  # never a half-written manifest


def _vouched(root: Path, remote: RemoteFile, entry: ManifestEntry | None) -> bool:
    """Does the manifest vouch for the file: same expected checksum, size and mtime as when verified?"""
    if entry is None or (entry.sha256, entry.git_blob) != (remote.sha256, remote.git_blob):
        return False
    try:
        st = (root / remote.path).stat()
    except OSError:
        return False
    return st.st_size == entry.size == remote.size and st.st_mtime_ns == entry.mtime_ns


def verify_checkpoint(
    root: Path, listing: Listing, previous: Manifest | None = None, threads: int = 2
) -> tuple[list[FileCheck], Manifest, list[str]]:
    """Check every listed file; hash only those the previous manifest cannot vouch for.

    Returns the checks (listing order), the new manifest (verified files only) and the paths hashed.
    """
    started = time.perf_counter()
    old = previous.files if previous is not None else {}
    hashed: list[str] = []

    def one(remote: RemoteFile) -> tuple[FileCheck, ManifestEntry | None]:
        entry = old.get(remote.path)
        if entry is not None and _vouched(root, remote, entry):
            return FileCheck(remote.path, True), entry
        hashed.append(remote.path)
        check = check_file(root, remote)
        if not check.ok:
            return check, None
        st = (root / remote.path).stat()
        now = datetime.now(UTC).isoformat(timespec="seconds")
        return check, ManifestEntry(st.st_size, st.st_mtime_ns, remote.sha256, remote.git_blob, now)

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        outcomes = list(pool.map(one, listing.files))
    manifest = Manifest(listing.repo, listing.commit)
    for remote, (_, entry) in zip(listing.files, outcomes, strict=True):
        if entry is not None:
            manifest.files[remote.path] = entry
    manifest.verify_seconds = round(time.perf_counter() - started, 3)
    return [check for check, _ in outcomes], manifest, sorted(hashed)


def differing_nodes(manifests: dict[str, Manifest], files: Iterable[str]) -> dict[str, str]:
    """Nodes whose manifest disagrees with the majority on commit or any file: node → why."""
    if not manifests:
        return {}
    paths = sorted(files)

    def key(m: Manifest) -> tuple[str, tuple[tuple[str, str | None], ...]]:
        return m.commit, tuple((p, (m.files[p].sha256 or m.files[p].git_blob) if p in m.files else None) for p in paths)

    keys = {node: key(m) for node, m in manifests.items()}
    majority = max(set(keys.values()), key=lambda k: sum(v == k for v in keys.values()))
    out = {}
    for node, k in keys.items():
        if k == majority:
            continue
        if k[0] != majority[0]:
            out[node] = f"commit {k[0]}, the other nodes have {majority[0]}"
        else:
            bad = [p for (p, h), (_, mh) in zip(k[1], majority[1], strict=True) if h != mh]
            out[node] = f"{len(bad)} file(s) differ: {', '.join(bad[:5])}"
    return out
