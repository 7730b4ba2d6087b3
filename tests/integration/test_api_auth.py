"""The CLI and a Prefect API off this machine: refused without an auth string, unless --insecure (then warned).

The API is the session's real Prefect server, reached through a plain TCP relay on the test bed's bridge
address: a non-loopback address of this machine, as a server across the network would be. The relay counts
the connections it carries, so a refusal is shown to happen before any request leaves.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from prefect.settings import PREFECT_API_URL

pytestmark = [pytest.mark.cli, pytest.mark.prefect, pytest.mark.testbed]


class Relay:
    """Accepts on (host, 0) and pipes each connection to `target`, both ways, until either side closes."""

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.target, self.connections = target, 0
        self.listener = socket.create_server((host, 0))
        self.address = self.listener.getsockname()[:2]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with suppress(OSError):  # closed at the end of the test
            while True:
                client, _ = self.listener.accept()
                self.connections += 1
                upstream = socket.create_connection(self.target, timeout=30)
                for a, b in ((client, upstream), (upstream, client)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def remote_api(prefect_server, testbed) -> Iterator[tuple[str, Relay]]:
    """The session's server as http://<bed bridge>:<port>/api."""
    local = urlsplit(str(PREFECT_API_URL.value()))
    relay = Relay(testbed.state.bridge["ip"], (str(local.hostname), int(local.port or 80)))
    try:
        yield f"http://{relay.address[0]}:{relay.address[1]}/api", relay
    finally:
        relay.close()


def k3deploy(*args: str, url: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    credentials = ("PREFECT_API_AUTH_STRING", "PREFECT_API_KEY", "K3DEPLOY_INSECURE")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(credentials)}
    environment |= {"PREFECT_API_URL": url, "K3DEPLOY_RUNS_DIR": str(tmp_path / "runs"),
                    "K3DEPLOY_HOME": str(tmp_path / "home"), "DO_NOT_TRACK": "1", **env}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "k3deploy", *args], capture_output=True, text=True, env=environment,
                          timeout=300, check=False)  # fmt: skip


def test_runs_against_a_remote_api_without_an_auth_string_is_refused_in_one_line(remote_api, tmp_path):
    url, relay = remote_api
    done = k3deploy("runs", url=url, tmp_path=tmp_path)
    assert done.returncode == 1, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"k3deploy: error: the Prefect API at {url} is not on this machine and no auth string")
    assert "PREFECT_API_AUTH_STRING" in lines[0] and "--insecure" in lines[0]
    assert relay.connections == 0  # refused before a request left
    assert not (tmp_path / "runs").exists() and done.stdout == ""


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_runs_with_insecure_talks_to_the_remote_api_and_warns(remote_api, tmp_path, how):
    url, relay = remote_api
    done = (k3deploy("--insecure", "runs", url=url, tmp_path=tmp_path) if how == "flag"
            else k3deploy("runs", url=url, tmp_path=tmp_path, K3DEPLOY_INSECURE_API="1"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"warning: --insecure: talking to the Prefect API at {url} without authentication" in done.stderr
    assert relay.connections >= 1  # it asked that server for the shared store
    assert "no recorded runs in" in done.stdout


def test_an_auth_string_lets_it_through_without_a_warning(remote_api, tmp_path):
    """The session's server asks for none, so any string is accepted: what is shown is the CLI's own check."""
    url, relay = remote_api
    done = k3deploy("runs", url=url, tmp_path=tmp_path, PREFECT_API_AUTH_STRING="a-string")
    assert done.returncode == 0, done.stderr
    assert "insecure" not in done.stderr and relay.connections >= 1
