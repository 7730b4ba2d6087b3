"""`k3deploy store`: the fleet's shared store (results and runs) saved on the server, and what it holds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated
from urllib.parse import unquote, urlsplit

import typer

from k3deploy.core.errors import K3DeployError

if TYPE_CHECKING:  # the CLI starts fast: paramiko and Prefect's blocks load when a store command runs
    from k3deploy.blocks.store import SftpStore

store_app = typer.Typer(help="The fleet's shared store: Prefect results and the runs store, on an SSH host.")
PROBE = ".k3deploy-store-probe"


def store_from(url: str, key_file: Path, known_hosts: Path, save_key: bool = False) -> SftpStore:
    """The store an sftp:// URL names, its host key taken from known_hosts (pinned, never trusted on first use);
    the SSH key by its path (every host has it there), or itself with `save_key`."""
    import paramiko
    from pydantic import SecretStr, ValidationError

    from k3deploy.blocks.ssh_keys import host_key_entry
    from k3deploy.blocks.store import SftpStore

    parts = urlsplit(url)
    if parts.scheme != "sftp" or not parts.hostname or not parts.username or not parts.path.startswith("/"):
        raise K3DeployError(f"{url!r}: give the store as sftp://USER@HOST[:PORT]/ABSOLUTE/PATH")
    port = parts.port or 22
    entry = host_key_entry(parts.hostname, port)
    try:
        keys = paramiko.HostKeys(str(known_hosts.expanduser())).lookup(entry)
    except OSError as error:
        raise K3DeployError(f"cannot read {known_hosts}: {error.strerror}") from None
    if not keys:
        raise K3DeployError(f"{entry} is not in {known_hosts}: add its host key there first (checked, not scanned)")
    kind = next(iter(keys.keys()))
    key_path = key_file.expanduser().resolve()
    try:
        private_key = SecretStr(key_path.read_text())
    except OSError as error:
        raise K3DeployError(f"cannot read the key file {key_file}: {error.strerror}") from None
    try:
        return SftpStore(host=parts.hostname, port=port, user=unquote(parts.username),
                         path=parts.path.rstrip("/") or "/", host_key=f"{kind} {keys[kind].get_base64()}",
                         private_key=private_key if save_key else None,
                         private_key_file=None if save_key else str(key_path))  # fmt: skip
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise K3DeployError(f"store {url}: {problems}") from None


@store_app.command("set")
def store_set(
    url: Annotated[str, typer.Argument(help="sftp://USER@HOST[:PORT]/PATH: a folder every worker's host reaches.")],
    key_file: Annotated[
        Path,
        typer.Option("--key-file", help="The SSH private key: the server keeps its path; every worker needs it there."),
    ],
    known_hosts: Annotated[
        Path, typer.Option("--known-hosts", help="known_hosts holding the store host's key, which is pinned.")
    ] = Path("~/.ssh/known_hosts"),
    save_key: Annotated[
        bool,
        typer.Option("--save-key", help="Keep the key itself on the server (a block secret) instead of its path."),
    ] = False,
) -> None:
    """Save the shared store on the server after writing and reading a probe file there."""
    from k3deploy.blocks.ssh_keys import parse_host_key
    from k3deploy.blocks.store import STORE_NAME
    from k3deploy.cli.common import err, out, prefect
    from k3deploy.tasks.transport.ssh import openssh_fingerprint

    store = store_from(url, key_file, known_hosts, save_key)
    with prefect() as info:
        store.write_path(PROBE, b"k3deploy\n")
        if store.read_path(PROBE) != b"k3deploy\n":
            raise K3DeployError(f"store {store.where()}: a probe file read back differently")
        store.save(STORE_NAME, overwrite=True)
    kind, key = parse_host_key(store.host_key)
    fingerprint = openssh_fingerprint(key.asbytes())
    out.print(f"shared store {store.where()} (host key {kind} {fingerprint}) saved on {info.url}", soft_wrap=True)
    if store.private_key_file is not None:
        out.print(f"its SSH key stays in {store.private_key_file}: the server keeps that path, not the key; every "
                  "worker host and user needs the key there", soft_wrap=True)  # fmt: skip
    else:
        err.print(f"warning: --save-key: the SSH key to {store.where()} is now a secret on the server: whoever can "
                  f"use {info.url} can read it", soft_wrap=True)  # fmt: skip
    out.print("workers keep stage results and run folders there; `k3deploy runs` reads it from any host")


@store_app.command("show")
def store_show() -> None:
    """Say which shared store the server has, if any."""
    from k3deploy.cli.common import out, prefect
    from k3deploy.tasks.transport.sftp_store import shared_store

    with prefect() as info:
        store = shared_store()
    if store is None:
        out.print(f"no shared store on {info.url}: results and runs stay on each worker's disk", soft_wrap=True)
    else:
        out.print(f"shared store {store.where()} on {info.url}", soft_wrap=True)
