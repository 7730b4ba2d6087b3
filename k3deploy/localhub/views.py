"""JSON bodies and headers of the local hub, in the shapes the real HF and ModelScope APIs give.

Pure functions of a commit and the fault switches, so the server module only does I/O.
Field names follow what `huggingface_hub` (hf_api.ModelInfo / RepoFile / RepoFolder,
file_download.get_hf_file_metadata) and `modelscope_hub` (_legacy_api, _download) parse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from k3deploy.localhub.faults import FileFaults
from k3deploy.localhub.store import Commit, FileEntry, Refs

FaultsOf = Callable[[str], FileFaults]  # file path -> its switches


class EntryNotFound(LookupError):
    """No such file or folder in the commit."""


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _shows_hash(entry: FileEntry, faults: FaultsOf) -> bool:
    return not faults(entry.path).drop_hash


def _under(path: str, folder: str, recursive: bool) -> bool:
    """Whether `path` is listed when listing `folder` ("" = root)."""
    prefix = f"{folder}/" if folder else ""
    return path.startswith(prefix) and path != folder and (recursive or "/" not in path[len(prefix) :])


def _check_folder(commit: Commit, folder: str) -> None:
    if folder not in commit.dirs:
        raise EntryNotFound(folder)


def hf_model_info(repo_id: str, commit: Commit, blobs: bool, faults: FaultsOf) -> dict[str, Any]:
    """GET /api/models/{repo}/revision/{rev}: `sha` and `siblings` (with sizes and LFS info if blobs)."""
    siblings = []
    for entry in commit.files.values():
        sibling: dict[str, Any] = {"rfilename": entry.path}
        if blobs:
            sibling |= {"size": entry.size, "blobId": entry.blob}
            if entry.lfs and _shows_hash(entry, faults):
                sibling["lfs"] = {"sha256": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
        siblings.append(sibling)
    created = _iso(commit.created)
    return {
        "id": repo_id,
        "modelId": repo_id,
        "author": repo_id.split("/")[0],
        "sha": commit.sha,
        "lastModified": created,
        "createdAt": created,
        "private": False,
        "disabled": False,
        "gated": False,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
        "usedStorage": sum(e.size for e in commit.files.values()),
    }


def hf_tree(commit: Commit, folder: str, recursive: bool, faults: FaultsOf) -> list[dict[str, Any]]:
    """GET /api/models/{repo}/tree/{rev}[/{folder}]: RepoFolder and RepoFile entries, by path."""
    _check_folder(commit, folder)
    out: list[dict[str, Any]] = [
        {"type": "directory", "oid": oid, "size": 0, "path": path}
        for path, oid in commit.dirs.items()
        if path and _under(path, folder, recursive)
    ]
    for entry in commit.files.values():
        if _under(entry.path, folder, recursive):
            item: dict[str, Any] = {"type": "file", "oid": entry.blob, "size": entry.size, "path": entry.path}
            if entry.lfs and _shows_hash(entry, faults):
                item["lfs"] = {"oid": entry.sha256, "size": entry.size, "pointerSize": entry.pointer_size}
            out.append(item)
    return sorted(out, key=lambda item: item["path"])


def file_headers(commit: Commit, entry: FileEntry, faults: FaultsOf) -> dict[str, str]:
    """Headers of a file response on both routes (HF reads X-Linked-*, ModelScope X-Linked-ETag).

    An LFS file's ETag is its sha256, a git file's ETag its blob id, as on huggingface.co.
    """
    headers = {
        "Content-Type": "application/octet-stream",
        "Accept-Ranges": "bytes",
        "X-Repo-Commit": commit.sha,
        "Content-Disposition": f'attachment; filename="{entry.path.rpartition("/")[2]}"',
    }
    if entry.lfs and _shows_hash(entry, faults):
        return headers | {
            "ETag": f'"{entry.sha256}"',
            "X-Linked-Etag": f'"{entry.sha256}"',
            "X-Linked-Size": str(entry.size),
        }
    return headers | {"ETag": f'"{entry.blob}"'}


def ms_envelope(data: Any) -> dict[str, Any]:
    """The wrapper every ModelScope /api/v1 answer has; the client unwraps `Data`."""
    return {"Code": 200, "Data": data, "Message": "success", "Success": True}


def ms_error(message: str, code: int = 404) -> dict[str, Any]:
    """A ModelScope error body; the client maps the HTTP status to NotExistError etc."""
    return {"Code": code, "Data": None, "Message": message, "Success": False}


def ms_files(
    commit: Commit, folder: str, recursive: bool, faults: FaultsOf, changed: Mapping[str, Commit]
) -> dict[str, Any]:
    """GET /api/v1/models/{repo}/repo/files: `Files` with Path, Name, Type, Size, Sha256, IsLFS, and, as the real
    hub gives them, the commit that last changed each file (`Revision`, `CommittedDate`, `CommitMessage`)."""
    _check_folder(commit, folder)
    entries = [
        {
            "Name": path.rpartition("/")[2],
            "Path": path,
            "Type": "tree",
            "Size": 0,
            "Sha256": "",
            "IsLFS": False,
            "Id": oid,
            "Mode": "40000",
            "Revision": commit.sha,
        }
        for path, oid in commit.dirs.items()
        if path and _under(path, folder, recursive)
    ]
    entries += [
        {
            "Name": e.path.rpartition("/")[2],
            "Path": e.path,
            "Type": "blob",
            "Size": e.size,
            "Sha256": e.sha256 if _shows_hash(e, faults) else "",
            "IsLFS": e.lfs,
            "Id": e.blob,
            "Mode": "100644",
            "Revision": changed[e.path].sha,
            "CommittedDate": int(changed[e.path].created),
            "CommitMessage": changed[e.path].message,
        }
        for e in commit.files.values()
        if _under(e.path, folder, recursive)
    ]
    return {"Files": sorted(entries, key=lambda item: item["Path"])}


def ms_model(repo_id: str) -> dict[str, Any]:
    """GET /api/v1/models/{repo}: basic repo metadata (the client only needs the repo to exist)."""
    org, name = repo_id.split("/")
    return {"Name": name, "Path": org, "ModelId": repo_id}


def ms_revisions(refs: Refs, created: Callable[[str], float]) -> dict[str, Any]:
    """GET /api/v1/models/{repo}/revisions: branches and tags with their commit and date."""

    def detail(names: dict[str, str]) -> list[dict[str, Any]]:
        return [
            {"Revision": name, "CommitId": sha, "CreatedAt": int(created(sha))} for name, sha in sorted(names.items())
        ]

    return {"RevisionMap": {"Branches": detail(refs.branches), "Tags": detail(refs.tags)}}
