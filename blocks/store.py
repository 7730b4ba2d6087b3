"""The fleet's shared store, as a Prefect block: a folder on a host, reached over SFTP with a pinned host key.

Workers on several hosts keep in it what later runs need: Prefect's results of the stages that passed
(so a Retry picked up by another worker skips them) and the runs store's records and reports (so
`k3deploy runs`, `report --compare` and every run's history see the runs of every worker). It is saved on the
server (`k3deploy store set`): where the store is and its pinned host key. The SSH key stays a file on each
worker host (`private_key_file`), so the server never holds it; saving the key itself in the block
(`private_key`) is the user's explicit choice. fsspec's SFTP trusts any host key; this one never does. Like
Prefect's own file-system blocks it reads and writes files itself (Prefect's result store calls it); what the
runs store does with it (push a run's folder, pull the fleet's) is tasks/transport/sftp_store.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import posixpath
import uuid
from collections.abc import Iterator
from pathlib import Path

import paramiko
from prefect._internal.compatibility.async_dispatch import async_dispatch
from prefect.filesystems import WritableFileSystem
from pydantic import ConfigDict, Field, SecretStr, field_validator, model_validator

from k3deploy.blocks._types import AbsPath, HostAddress, Name
from k3deploy.blocks.ssh_keys import host_key_entry, load_private_key, parse_host_key
from k3deploy.core.errors import K3DeployError

STORE_NAME = "shared"  # the one store of a server: `k3deploy-sftp-store/shared`
RUNS = "runs"  # the runs store's folder in the store; Prefect's results sit beside it, one file per key


class StoreError(K3DeployError):
    """The shared store cannot be reached, refused us, or lacks a file; names the store, never its key."""


class SftpStore(WritableFileSystem):
    """A folder on an SSH host that every worker and every user's CLI reach the same way."""

    model_config = ConfigDict(extra="forbid")
    _block_type_name = "k3deploy sftp store"
    _description = "The fleet's shared results and runs store: a folder on an SSH host, host key pinned."

    host: HostAddress = Field(description="The store's host: an IP address or DNS name every worker reaches.")
    port: int = Field(default=22, ge=1, le=65535, description="Its SSH port.")
    user: Name = Field(description="The SSH user that owns the store's folder.")
    path: AbsPath = Field(description="The store's folder on that host (absolute); made on first write.")
    host_key: str = Field(
        description="The host's public key as known_hosts has it after the name: `ssh-ed25519 AAAA…`. "
        "Pinned: a host that shows another key is refused."
    )
    private_key_file: AbsPath | None = Field(
        default=None,
        description="Where the SSH private key (unencrypted) is on every worker and user host; the server keeps "
        "only this path.",
    )
    private_key: SecretStr | None = Field(
        default=None,
        description="The SSH private key itself, kept on the server: whoever can read the server's blocks can read "
        "it. Leave empty and use private_key_file.",
    )

    @field_validator("host_key")
    @classmethod
    def _public_key(cls, value: str) -> str:
        parse_host_key(value)
        return value

    @model_validator(mode="after")
    def _one_key(self) -> SftpStore:
        if (self.private_key_file is None) == (self.private_key is None):
            raise ValueError("give the SSH key as private_key_file (a path on every host) or private_key, not both")
        return self

    def _pkey(self) -> paramiko.PKey:
        if self.private_key is not None:
            return load_private_key(self.private_key)
        try:
            text = Path(str(self.private_key_file)).read_text()
        except OSError as error:
            raise StoreError(f"store {self.where()}: cannot read the SSH key file {self.private_key_file} on "
                             f"{os.uname().nodename}: {error.strerror}; every host using the store needs it "
                             "there") from None  # fmt: skip
        return load_private_key(SecretStr(text))

    def where(self) -> str:
        """The store as a person reads it: never the key."""
        return f"sftp://{self.user}@{self.host}:{self.port}{self.path}"

    @contextlib.contextmanager
    def session(self) -> Iterator[paramiko.SFTPClient]:
        """One SSH connection, its host key checked against the pinned one, for several transfers."""
        client = paramiko.SSHClient()
        kind, key = parse_host_key(self.host_key)
        client.get_host_keys().add(host_key_entry(self.host, self.port), kind, key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(self.host, port=self.port, username=self.user, pkey=self._pkey(), timeout=10,
                           allow_agent=False, look_for_keys=False)  # fmt: skip
        except paramiko.BadHostKeyException:
            client.close()
            raise StoreError(f"store {self.where()}: the host showed another key than the pinned one") from None
        except (OSError, EOFError, paramiko.SSHException) as err:
            client.close()
            raise StoreError(f"store {self.where()}: cannot connect: {err}") from None
        try:
            yield client.open_sftp()
        finally:
            client.close()

    def full(self, key: str) -> str:
        """A key's path in the store; a key never leaves the store's folder."""
        path = posixpath.normpath(posixpath.join(self.path, key))
        if not (path + "/").startswith(self.path.rstrip("/") + "/") or path == self.path.rstrip("/"):
            raise StoreError(f"store {self.where()}: {key!r} is not a path inside the store")
        return path

    async def aread_path(self, path: str) -> bytes:
        return await asyncio.to_thread(self._read, path)

    @async_dispatch(aread_path)
    def read_path(self, path: str) -> bytes:  # type: ignore[override]  # Prefect's own blocks dispatch the same way
        """One file's bytes; Prefect's result store reads a missing key as a cache miss."""
        return self._read(path)

    async def awrite_path(self, path: str, content: bytes) -> str:
        return await asyncio.to_thread(self._write, path, content)

    @async_dispatch(awrite_path)
    def write_path(self, path: str, content: bytes) -> str:  # type: ignore[override]
        """Written whole or not at all (a temporary name, then renamed), parents made."""
        return self._write(path, content)

    def _read(self, path: str) -> bytes:
        with self.session() as sftp:
            return read_file(sftp, self.full(path))

    def _write(self, path: str, content: bytes) -> str:
        with self.session() as sftp:
            write_file(sftp, self.full(path), content)
        return path


def read_file(sftp: paramiko.SFTPClient, path: str) -> bytes:
    try:
        with sftp.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is not in the store") from None


def write_file(sftp: paramiko.SFTPClient, path: str, content: bytes) -> None:
    make_dirs(sftp, posixpath.dirname(path))
    part = f"{path}.part-{uuid.uuid4().hex[:8]}"
    sftp.putfo(io.BytesIO(content), part)
    sftp.posix_rename(part, path)


def make_dirs(sftp: paramiko.SFTPClient, path: str) -> None:
    missing: list[str] = []
    while path not in ("", "/"):
        try:
            sftp.stat(path)
            break
        except FileNotFoundError:
            missing.append(path)
            path = posixpath.dirname(path)
    for folder in reversed(missing):
        with contextlib.suppress(OSError):  # made meanwhile by another worker
            sftp.mkdir(folder)
