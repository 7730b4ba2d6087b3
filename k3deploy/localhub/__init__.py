"""The local model hub: serves checkpoints from a folder to the real `huggingface_hub` and `modelscope` clients.

The local profile starts one for its run (see `k3deploy.tasks.models.localhub`); tests start their own.

- `server`: `HubServer`, the HTTP server on a background thread, and the ``python -m k3deploy.localhub`` CLI.
- `store`: the on-disk layout under the hub's root and `publish` / `set_ref` to write revisions into it.
- `views`: the JSON bodies and headers, in the shapes the real HF and ModelScope APIs give (pure).
- `faults`: fault switches (corrupt, drop the hash, truncate, slow) and the request log.
"""

from k3deploy.localhub.faults import Faults, FileFaults, RequestLog, RequestRecord
from k3deploy.localhub.server import HubServer
from k3deploy.localhub.store import (
    Commit,
    FileEntry,
    Refs,
    RepoNotFound,
    RevisionNotFound,
    lfs_pointer,
    publish,
    read_refs,
    resolve,
    set_ref,
)

__all__ = [
    "Commit",
    "Faults",
    "FileEntry",
    "FileFaults",
    "HubServer",
    "Refs",
    "RepoNotFound",
    "RequestLog",
    "RequestRecord",
    "RevisionNotFound",
    "lfs_pointer",
    "publish",
    "read_refs",
    "resolve",
    "set_ref",
]
