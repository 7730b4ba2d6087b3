"""What the hub says a checkpoint is: its commit and every file's size and checksum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr

from k3deploy.core.errors import HubError


@dataclass(frozen=True)
class RemoteFile:
    """One file as the hub lists it; sha256 when the hub has it, else the git blob id."""

    path: str
    size: int
    sha256: str | None
    git_blob: str | None


@dataclass(frozen=True)
class Listing:
    repo: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _size(path: Any, size: Any) -> int:
    """A listed file's size in bytes; HubError naming the file when the hub gave no path or no size."""
    try:
        value = int(size) if isinstance(path, str) and path and not isinstance(size, bool) else -1
    except (TypeError, ValueError, OverflowError):
        value = -1
    if value < 0:
        raise HubError(f"the hub lists a file without a path and a byte size: path {path!r:.200}, size {size!r:.40}")
    return value


def _checksum(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def hf_file(entry: Any) -> RemoteFile | None:
    """A huggingface_hub tree entry (RepoFile) as a RemoteFile; folders give None."""
    if not hasattr(entry, "size") or getattr(entry, "blob_id", None) is None:
        return None
    lfs = getattr(entry, "lfs", None)
    sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
    size = _size(entry.path, entry.size)
    return RemoteFile(entry.path, size, _checksum(sha256), None if _checksum(sha256) else _checksum(entry.blob_id))


def ms_file(item: dict[str, Any]) -> RemoteFile | None:
    """A ModelScope `repo/files` item as a RemoteFile; folders give None."""
    if item.get("Type") == "tree":
        return None
    size = _size(item.get("Path"), item.get("Size"))
    return RemoteFile(item["Path"], size, _checksum(item.get("Sha256")), _checksum(item.get("Id")))


def list_huggingface(repo: str, revision: str | None, endpoint: str | None, token: SecretStr | None) -> Listing:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint, token=token.get_secret_value() if token else False)
    try:
        commit = api.model_info(repo, revision=revision).sha
        entries = api.list_repo_tree(repo, revision=commit, recursive=True)
        files = tuple(f for f in (hf_file(e) for e in entries) if f is not None)
    except HfHubHTTPError as err:
        raise HubError(f"huggingface {repo}@{revision or 'main'}: {err}") from None
    if not commit:
        raise HubError(f"huggingface {repo}@{revision}: the hub returned no commit")
    return Listing(repo, commit, files)


def download_urls(hub: str, listing: Listing, revision: str | None, endpoint: str | None) -> dict[str, str]:
    """Each file's download URL, as the hub's own client builds it (HF by commit; ModelScope by revision)."""
    if hub == "huggingface":
        from huggingface_hub import hf_hub_url

        commit = listing.commit
        return {f.path: hf_hub_url(listing.repo, f.path, revision=commit, endpoint=endpoint) for f in listing.files}
    from modelscope.hub.file_download import get_file_download_url

    return {
        f.path: get_file_download_url(listing.repo, f.path, revision or "master", endpoint=endpoint)
        for f in listing.files
    }


def auth_headers(token: SecretStr | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token.get_secret_value()}"} if token else {}


def list_modelscope(repo: str, revision: str | None, endpoint: str, token: SecretStr | None) -> Listing:
    headers = auth_headers(token)
    url = f"{endpoint.rstrip('/')}/api/v1/models/{repo}/repo/files"
    params = {"Revision": revision or "master", "Recursive": "True"}
    try:
        response = httpx.get(url, params=params, headers=headers, timeout=60)
        response.raise_for_status()
        items = response.json()["Data"]["Files"]
    except (httpx.HTTPError, KeyError, TypeError, ValueError) as err:
        raise HubError(f"modelscope {repo}@{params['Revision']}: cannot list files: {err}") from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise HubError(f"modelscope {repo}@{params['Revision']}: the file list is not a list of files: {items!r:.200}")
    try:
        files = tuple(f for f in (ms_file(i) for i in items) if f is not None)
        commit = ms_head_commit(items)
    except HubError as err:
        raise HubError(f"modelscope {repo}@{params['Revision']}: {err}") from None
    return Listing(repo, commit, files)


def ms_head_commit(items: list[dict[str, Any]]) -> str:
    """The commit the listing is of: each file's `Revision` is the commit that last changed it (ModelScope's SDK
    reads it as "the commit id of the file", with that commit's date beside it), so it is the newest of them."""
    try:
        dated = [
            (int(i.get("CommittedDate") or 0), str(i["Revision"]))
            for i in items
            if i.get("Type") != "tree" and i.get("Revision")
        ]
    except (TypeError, ValueError, OverflowError) as err:
        raise HubError(f"a file's CommittedDate is not a time: {err}") from None
    if not dated:
        raise HubError("the listing names no commit")
    newest = max(date for date, _ in dated)
    heads = {rev for date, rev in dated if date == newest}
    if len(heads) != 1:
        raise HubError(f"the newest files name {len(heads)} commits of the same time: {', '.join(sorted(heads))}")
    return heads.pop()
