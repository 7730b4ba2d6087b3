"""A PostgreSQL server for the session (a fixture): Debian's `postgresql` binaries, its data in a folder of its
own, on a free loopback port. Run as the `postgres` user, as PostgreSQL refuses root."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

BINARIES = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
needs_postgres = pytest.mark.skipif(
    not BINARIES, reason="needs PostgreSQL (apt install postgresql; .ci/run installs it)"
)


def _as_postgres(*argv: str) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *argv], check=True, capture_output=True, timeout=120, cwd="/")


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """The SQLAlchemy URL of an empty `prefect` database (trust auth on loopback: no password to keep)."""
    bin_dir = BINARIES[-1].parent
    folder = Path(tempfile.mkdtemp(prefix="k3d-postgres-"))  # under /tmp: pytest's own folders are root's alone
    user = pwd.getpwnam("postgres")
    os.chown(folder, user.pw_uid, user.pw_gid)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = folder / "data"
    _as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    _as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"), "-w", "-t", "60",
                 "start")  # fmt: skip
    try:
        _as_postgres(str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "prefect")
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect"
    finally:
        _as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def psql(url: str, query: str) -> str:
    """One query's unaligned result, through Debian's psql."""
    port = url.rsplit(":", 1)[1].split("/")[0]
    psql_bin = BINARIES[-1].parent / "psql"
    out = subprocess.run([str(psql_bin), "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", "prefect", "-Atc",
                          query], check=True, capture_output=True, text=True, timeout=60)  # fmt: skip
    return out.stdout.strip()
