"""On-disk layout of the local model hub, and `publish` to write revisions into it.

Layout under a root folder (everything a test needs to make revisions is here)::

    <root>/<org>/<name>/refs.json                   {"branches": {"main": sha}, "tags": {"v1": sha}}
    <root>/<org>/<name>/commits/<sha>/meta.json     parent, tree id, date, per-file size/sha256/git blob id
    <root>/<org>/<name>/commits/<sha>/files/<path>  the commit's files, byte for byte

Commit, tree and blob ids are real git object ids (sha1 of the git object text, LFS files
hashed as their pointer file), so a commit sha is derived from content and parent only and
the metadata the server reports has the shapes the real hubs give. Commits are immutable;
only refs.json moves. One publisher at a time per repo.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

LFS_MIN_SIZE = 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".bin")
_CHUNK = 8 * 1024 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_AUTHOR = "k3deploy-hub <hub@localhost> 0 +0000"


class RepoNotFound(LookupError):
    """The repo folder does not exist."""


class RevisionNotFound(LookupError):
    """No branch, tag or commit of that name in the repo."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a commit, with every id the hubs report for it."""

    path: str
    size: int
    sha256: str
    blob: str  # git blob id of what git stores: the content, or the LFS pointer
    lfs: bool

    @property
    def pointer_size(self) -> int:
        """Size of the git-lfs pointer file, which HF reports as `pointerSize`."""
        return len(lfs_pointer(self.sha256, self.size))


@dataclass(frozen=True)
class Commit:
    """An immutable snapshot of a repo: its files and where their bytes live."""

    sha: str
    parent: str | None
    tree: str
    created: float
    message: str
    files: dict[str, FileEntry]
    dirs: dict[str, str]  # folder path ("" = root) -> git tree id
    folder: Path

    def blob_path(self, path: str) -> Path:
        """Where the bytes of `path` are stored."""
        return self.folder / "files" / path


@dataclass(frozen=True)
class Refs:
    """Branch and tag names of a repo, each pointing at a commit sha."""

    branches: dict[str, str]
    tags: dict[str, str]


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def is_lfs(path: str, size: int) -> bool:
    """Whether the hub treats this file as LFS (large, or a weights file by name)."""
    return size >= LFS_MIN_SIZE or path.endswith(LFS_SUFFIXES)


def repo_dir(root: Path, repo_id: str) -> Path:
    """Folder of `org/name`; rejects ids that could escape the root."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts):
        raise ValueError(f"repo id must be 'org/name' of [A-Za-z0-9._-]: {repo_id!r}")
    return Path(root) / parts[0] / parts[1]


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"invalid repo file path: {path!r}")
    return path


def _git_id(kind: str, body: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()


def _chunks(source: bytes | Path) -> Iterator[bytes]:
    if isinstance(source, bytes):
        yield source
        return
    with Path(source).open("rb") as f:
        while chunk := f.read(_CHUNK):
            yield chunk


def _write_blob(dest: Path, source: bytes | Path) -> tuple[int, str, str]:
    """Copy `source` to `dest` in chunks; return size, sha256 and git blob id of the content."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    size = len(source) if isinstance(source, bytes) else Path(source).stat().st_size
    sha256 = hashlib.sha256()
    git = hashlib.sha1(f"blob {size}\0".encode())
    with dest.open("wb") as out:
        for chunk in _chunks(source):
            sha256.update(chunk)
            git.update(chunk)
            out.write(chunk)
    return size, sha256.hexdigest(), git.hexdigest()


def _tree_ids(files: dict[str, FileEntry]) -> dict[str, str]:
    """Git tree id of every folder ("" = root), computed deepest first as git does."""
    folders: dict[str, dict[str, tuple[str, str]]] = {"": {}}
    for path, entry in files.items():
        folder, _, name = path.rpartition("/")
        folders.setdefault(folder, {})[name] = ("100644", entry.blob)
        while folder:
            folder = folder.rpartition("/")[0]
            folders.setdefault(folder, {})
    ids: dict[str, str] = {}
    for folder in sorted(folders, key=lambda f: f.count("/") + 1 if f else 0, reverse=True):
        # git orders a folder entry as if its name ended in "/"
        items = sorted(folders[folder].items(), key=lambda kv: kv[0] + ("/" if kv[1][0] == "40000" else ""))
        ids[folder] = _git_id(
            "tree", b"".join(f"{mode} {name}".encode() + b"\0" + bytes.fromhex(oid) for name, (mode, oid) in items)
        )
        if folder:
            parent, _, name = folder.rpartition("/")
            folders[parent][name] = ("40000", ids[folder])
    return ids


def read_refs(root: Path, repo_id: str) -> Refs:
    """Current refs of a repo; RepoNotFound if it was never published."""
    path = repo_dir(root, repo_id) / "refs.json"
    if not path.is_file():
        raise RepoNotFound(repo_id)
    data = json.loads(path.read_text())
    return Refs(branches=data.get("branches", {}), tags=data.get("tags", {}))


def _write_refs(root: Path, repo_id: str, refs: Refs) -> None:
    path = repo_dir(root, repo_id) / "refs.json"
    tmp = path.with_name(f".refs-{uuid.uuid4().hex}.json")
    tmp.write_text(json.dumps({"branches": refs.branches, "tags": refs.tags}, indent=1, sort_keys=True))
    os.replace(tmp, path)


@functools.lru_cache(maxsize=256)
def _load_commit(folder: Path) -> Commit:
    """Commits are immutable, so their metadata is read once."""
    meta = json.loads((folder / "meta.json").read_text())
    files = {f["path"]: FileEntry(**f) for f in meta["files"]}
    return Commit(
        meta["sha"], meta["parent"], meta["tree"], meta["created"], meta["message"], files, meta["dirs"], folder
    )


def resolve(root: Path, repo_id: str, revision: str) -> Commit:
    """Branch, tag or full commit sha -> commit (branches win over tags, as on the hubs)."""
    refs = read_refs(root, repo_id)
    sha = refs.branches.get(revision) or refs.tags.get(revision) or (revision if _SHA.match(revision) else None)
    folder = repo_dir(root, repo_id) / "commits" / str(sha)
    if sha is None or not (folder / "meta.json").is_file():
        raise RevisionNotFound(f"{repo_id}@{revision}")
    return _load_commit(folder)


def last_changes(root: Path, repo_id: str, head: Commit) -> dict[str, Commit]:
    """Each file of `head` -> the commit that last changed it (ModelScope gives that commit as the file's Revision)."""
    chain = [head]
    while chain[-1].parent is not None:
        chain.append(resolve(root, repo_id, chain[-1].parent))
    out = {}
    for path, entry in head.files.items():
        at = 0
        while at + 1 < len(chain) and (older := chain[at + 1].files.get(path)) is not None and older.blob == entry.blob:
            at += 1
        out[path] = chain[at]
    return out


def set_ref(root: Path, repo_id: str, name: str, sha: str, *, tag: bool = False) -> None:
    """Point branch (or tag) `name` at an existing commit, e.g. to tag a release."""
    resolve(root, repo_id, sha)
    refs = read_refs(root, repo_id)
    (refs.tags if tag else refs.branches)[name] = sha
    _write_refs(root, repo_id, refs)


def publish(
    root: str | Path,
    repo_id: str,
    files: dict[str, bytes | Path],
    revision: str = "main",
    message: str = "",
    created: float | None = None,
) -> str:
    """Write `files` (the complete file set) as a new commit on branch `revision`; return its sha.

    The parent is the branch's current head. Publishing the same files again returns the head
    unchanged, so fixtures can publish idempotently.
    """
    root = Path(root)
    base = repo_dir(root, repo_id)
    (base / "commits").mkdir(parents=True, exist_ok=True)
    try:
        refs = read_refs(root, repo_id)
    except RepoNotFound:
        refs = Refs(branches={}, tags={})
    parent = refs.branches.get(revision)
    tmp = base / "commits" / f".tmp-{uuid.uuid4().hex}"
    try:
        entries: dict[str, FileEntry] = {}
        for path in sorted(files):
            size, sha256, blob = _write_blob(tmp / "files" / _check_path(path), files[path])
            lfs = is_lfs(path, size)
            entries[path] = FileEntry(
                path, size, sha256, _git_id("blob", lfs_pointer(sha256, size)) if lfs else blob, lfs
            )
        dirs = _tree_ids(entries)
        if parent is not None and resolve(root, repo_id, parent).tree == dirs[""]:
            return parent
        message = message or f"publish {revision}"
        text = f"tree {dirs['']}\n" + (f"parent {parent}\n" if parent else "")
        text += f"author {_AUTHOR}\ncommitter {_AUTHOR}\n\n{message}\n"
        sha = _git_id("commit", text.encode())
        meta = {
            "sha": sha,
            "parent": parent,
            "tree": dirs[""],
            "created": time.time() if created is None else created,
            "message": message,
            "files": [asdict(e) for e in entries.values()],
            "dirs": dirs,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        final = base / "commits" / sha
        if not final.exists():
            tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    refs.branches[revision] = sha
    _write_refs(root, repo_id, refs)
    return sha
