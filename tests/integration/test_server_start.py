"""Two k3deploys starting their Prefect server at once on one machine (two homes: two users, or a CI job beside
a person): each gets a server of its own, on a port of its own, and talks to it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.cli, pytest.mark.prefect, pytest.mark.anywhere]


def k3deploy(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"K3DEPLOY_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "k3deploy", "server", *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)  # fmt: skip


def test_two_servers_started_at_once_each_get_their_own_port(tmp_path):
    homes = [tmp_path / "a", tmp_path / "b"]
    try:
        with ThreadPoolExecutor(2) as pool:
            started = list(pool.map(lambda home: k3deploy(home, "start"), homes))
        for out in started:
            assert out.returncode == 0, out.stdout + out.stderr
        lines = [re.search(r"running at (http://127\.0\.0\.1:(\d+)) \(pid (\d+)\)", out.stdout) for out in started]
        assert all(lines), [out.stdout for out in started]
        ports = {m.group(2) for m in lines if m}
        assert len(ports) == 2, ports  # not one server answering for both
        for home, m in zip(homes, lines, strict=True):
            assert m is not None
            # the pid each home recorded is the server that listens on its port
            listening = subprocess.run(["ss", "-Htlnp", f"sport = :{m.group(2)}"], capture_output=True, text=True)
            assert f"pid={m.group(3)}," in listening.stdout, listening.stdout
            assert httpx.get(f"{m.group(1)}/api/health", timeout=30).status_code == 200
            assert k3deploy(home, "status").stdout.startswith(f"running at {m.group(1)}")
    finally:
        for home in homes:
            k3deploy(home, "stop")
