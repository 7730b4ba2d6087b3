"""What the runs store does with the fleet's shared store (blocks/store.py): push a run's folder, pull the
fleet's runs, and find the server's store."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import paramiko
from prefect.settings import PREFECT_API_URL

from k3deploy.blocks.store import STORE_NAME, SftpStore, StoreError, read_file, write_file


def listing(sftp: paramiko.SFTPClient, path: str) -> dict[str, paramiko.SFTPAttributes]:
    """A folder's entries by name; an absent folder is empty."""
    try:
        return {a.filename: a for a in sftp.listdir_attr(path)}
    except FileNotFoundError:
        return {}


def push_folder(store: SftpStore, local: Path, key: str) -> int:
    """Copy a local folder's files into the store under `key` (replacing same-named files, keeping their
    modification times); files sent."""
    sent = 0
    with store.session() as sftp:
        for file in sorted(p for p in local.rglob("*") if p.is_file()):
            path, mtime = store.full(f"{key}/{file.relative_to(local).as_posix()}"), int(file.stat().st_mtime)
            write_file(sftp, path, file.read_bytes())
            sftp.utime(path, (mtime, mtime))  # when the worker wrote it: what a pull compares
            sent += 1
    return sent


def pull_files(store: SftpStore, key: str, names: tuple[str, ...], local_root: Path) -> list[str]:
    """For each folder under `key`: its files of these names into local_root/<folder>/ where the store's copy
    is newer than ours or we have none (a record rewritten by a Retry elsewhere comes again); folders fetched."""
    fetched: list[str] = []
    with store.session() as sftp:
        for folder, attrs in sorted(listing(sftp, store.full(key)).items()):
            if not stat.S_ISDIR(attrs.st_mode or 0):
                continue
            present = listing(sftp, store.full(f"{key}/{folder}"))
            for name in (n for n in names if n in present):
                target, mtime = local_root / folder / name, present[name].st_mtime or 0
                if target.exists() and target.stat().st_mtime >= mtime:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(read_file(sftp, store.full(f"{key}/{folder}/{name}")))
                os.utime(target, (mtime, mtime))
                fetched.append(f"{folder}/{name}")
    return fetched


# The stores this process found unreachable at a run's start (preflight), by where(): why. A run that goes on
# without its store (store.on_unreachable: local) keeps its results on this host and says its history is partial.
_UNREACHABLE: dict[str, str] = {}


def reach(store: SftpStore) -> str | None:
    """None when the store answers (a connection, its folder listed); else why not, and it is remembered."""
    try:
        with store.session() as sftp:
            listing(sftp, store.path)
    except (StoreError, OSError, EOFError, paramiko.SSHException) as err:
        _UNREACHABLE[store.where()] = str(err)
        return str(err)
    _UNREACHABLE.pop(store.where(), None)
    return None


def unreachable(store: SftpStore) -> str | None:
    """Why this run's store was found unreachable at its start, None if it was not."""
    return _UNREACHABLE.get(store.where())


def unpushed_runs(store: SftpStore, local_root: Path, key: str,
                  records: tuple[str, ...] = ("record.json", "bisect.json", "tune.json")) -> list[str]:  # fmt: skip
    """This host's folders holding a record (a run's, a bisect's, a tune's) that the store does not hold (made
    while it was away)."""
    with store.session() as sftp:
        held = set(listing(sftp, store.full(key)))
    mine = {p.parent.name for name in records for p in local_root.glob(f"*/{name}")}
    return sorted(mine - held)


def shared_store() -> SftpStore | None:
    """The server's shared store, None when there is no server or it has none (one host: the local disk)."""
    if not PREFECT_API_URL.value():
        return None
    try:
        loaded: Any = SftpStore.load(STORE_NAME, validate=True)
    except ValueError:  # Prefect's "Unable to find block document named shared"
        return None
    return loaded if isinstance(loaded, SftpStore) else None
