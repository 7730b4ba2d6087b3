"""The Prefect server the CLI talks to: $PREFECT_API_URL when set, else one of k3deploy's own on loopback.

Prefect's temporary server costs ~15 s per command and sometimes misses its start-up deadline;
a server started once and reused costs nothing after the first command, and its UI shows
every run and artifact. It keeps its database under ~/.k3deploy/prefect (K3DEPLOY_HOME).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from k3deploy.errors import K3DeployError

DEFAULT_PORT = 4200
START_TIMEOUT_S = 120.0


class ServerError(K3DeployError):
    """The local Prefect server could not be started or reached."""


@dataclass(frozen=True)
class ServerInfo:
    url: str  # the API, http://127.0.0.1:PORT/api
    pid: int | None  # None: a server k3deploy did not start ($PREFECT_API_URL)

    @property
    def ui(self) -> str:
        return self.url.removesuffix("/api")


def home() -> Path:
    return Path(os.environ.get("K3DEPLOY_HOME", "~/.k3deploy")).expanduser()


def _state_file() -> Path:
    return home() / "prefect-server.json"


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        return httpx.get(f"{api_url}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise ServerError("no free port on 127.0.0.1 for a Prefect server")


def recorded() -> ServerInfo | None:
    """The server this machine's k3deploy started earlier, if it still answers."""
    try:
        data = json.loads(_state_file().read_text())
        info = ServerInfo(str(data["url"]), int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if healthy(info.url) else None


def start(say: Callable[[str], None]) -> ServerInfo:
    """Start `prefect server start` on loopback in its own session; wait until /api/health answers."""
    port = _free_port(DEFAULT_PORT)
    url = f"http://127.0.0.1:{port}/api"
    folder = home()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "prefect-server.log"
    env = {
        **os.environ,
        "PREFECT_HOME": str(folder / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": url,
        # The UI's pages call the API at this URL (Prefect's default is port 4200 whatever port it serves on):
        # without it, a server on another port shows empty pages, or another server's runs.
        "PREFECT_UI_API_URL": url,
    }
    say(f"starting a local Prefect server at {url.removesuffix('/api')} (once; `k3deploy server stop` stops it)")
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*command, "--analytics-off"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # outlives this command: the next one reuses it
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not healthy(url, timeout=1.0):
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise ServerError(f"the Prefect server exited ({proc.returncode}); {log}: {' | '.join(tail)}")
        if time.monotonic() > deadline:
            proc.terminate()
            raise ServerError(f"the Prefect server did not answer within {START_TIMEOUT_S:g} s; see {log}")
        time.sleep(0.25)  # polling a process we just started; no event to wait on
    info = ServerInfo(url, proc.pid)
    _state_file().write_text(json.dumps({"url": info.url, "pid": info.pid}))
    return info


def ensure(say: Callable[[str], None]) -> ServerInfo:
    """The server to use: $PREFECT_API_URL, else ours (started now if it is not running)."""
    given = os.environ.get("PREFECT_API_URL")
    if given:
        return ServerInfo(given.rstrip("/"), None)
    return recorded() or start(say)


def stop() -> ServerInfo | None:
    """Stop the server k3deploy started, if it runs; returns what was stopped."""
    info = recorded()
    if info is None or info.pid is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(info.pid, signal.SIGTERM)
    _state_file().unlink(missing_ok=True)
    return info


@contextlib.contextmanager
def using(info: ServerInfo) -> Iterator[None]:
    """Prefect settings for a CLI command: this server, no heartbeat floor per flow run, no telemetry.

    The server and telemetry go through the environment and Prefect's global settings, which
    worker threads (the fan-out over nodes) see too: a temporary settings context reaches only
    this thread, and a thread without the API URL starts a temporary server of its own.
    """
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    os.environ["PREFECT_API_URL"] = info.url
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    refresh_global_settings_context()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
