"""Marked blocks in the user's ~/.ssh/config and ~/.ssh/known_hosts.

docker-py's `ssh://` transport (docker/transport/sshconn.py) builds a paramiko
client that reads only ~/.ssh/config (Host, User, IdentityFile, ProxyCommand;
paramiko ignores `Include` and `UserKnownHostsFile`) and
`load_system_host_keys()`, i.e. ~/.ssh/known_hosts, with RejectPolicy. So a
plain `docker.DockerClient(base_url="ssh://root@10.213.0.10")` can only work if
the bed's key and host keys are in those two files. The bed adds one clearly
marked block to each (config block first, so it wins over later `Host *`
entries), and `down` removes exactly those blocks; files it created are removed
again when nothing else is left in them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

BEGIN = "# >>> k3deploy-testbed (added by `python -m testbed up`; removed by `python -m testbed down`) >>>"
END = "# <<< k3deploy-testbed <<<"


def ssh_dir() -> Path:
    """~/.ssh as docker-py resolves it (os.path.expanduser, so $HOME wins)."""
    return Path(os.path.expanduser("~")) / ".ssh"


def strip_block(text: str) -> str:
    """`text` without any bed block (there should be at most one)."""
    out, skipping = [], False
    for line in text.splitlines(keepends=True):
        if line.rstrip("\n") == BEGIN:
            skipping = True
            continue
        if skipping:
            if line.rstrip("\n") == END:
                skipping = False
            continue
        out.append(line)
    return "".join(out)


def _block(lines: Sequence[str]) -> str:
    return "\n".join([BEGIN, *lines, END]) + "\n"


def config_lines(ips: Sequence[str], key: Path, known_hosts: Path, user: str) -> list[str]:
    return [
        "Host " + " ".join(ips),
        f"    User {user}",
        f"    IdentityFile {key}",
        "    IdentitiesOnly yes",
        f"    UserKnownHostsFile {known_hosts}",
        "    StrictHostKeyChecking yes",
    ]


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".k3tb-tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    tmp.replace(path)


def install(config: Sequence[str], known_hosts: Sequence[str], directory: Path | None = None) -> dict[str, str]:
    """Add (or replace) the bed blocks; returns what was touched, for `remove`."""
    d = directory or ssh_dir()
    created = not d.exists()
    d.mkdir(mode=0o700, exist_ok=True)
    touched: dict[str, str] = {"dir": str(d), "created_dir": "yes" if created else ""}
    for name, lines, prepend in (("config", config, True), ("known_hosts", known_hosts, False)):
        path = d / name
        old = strip_block(path.read_text()) if path.exists() else ""
        touched[f"created_{name}"] = "" if path.exists() else "yes"
        new = _block(lines) + old if prepend else old + ("" if not old or old.endswith("\n") else "\n") + _block(lines)
        _write(path, new, 0o600)
    return touched


def remove(touched: dict[str, str] | None = None, directory: Path | None = None) -> None:
    """Strip the bed blocks; delete files (and ~/.ssh) the bed created if now empty."""
    d = Path(touched["dir"]) if touched else (directory or ssh_dir())
    for name in ("config", "known_hosts"):
        path = d / name
        if not path.exists():
            continue
        rest = strip_block(path.read_text())
        if not rest.strip() and touched and touched.get(f"created_{name}"):
            path.unlink()
        elif rest != path.read_text():
            _write(path, rest, path.stat().st_mode & 0o777)
    if touched and touched.get("created_dir") and d.exists() and not any(d.iterdir()):
        d.rmdir()
