"""The Prefect server the CLI talks to: $PREFECT_API_URL when set, else one of k3deploy's own on loopback.

Prefect's temporary server costs ~15 s per command and sometimes misses its start-up deadline;
a server started once and reused costs nothing after the first command, and its UI shows
every run and artifact. It keeps its database under ~/.k3deploy/prefect (K3DEPLOY_HOME).

The server holds every saved block's secrets and starts runs that SSH into the nodes: an API that is
reached over the network without Prefect's basic authentication hands both to whoever reaches it.
`checked_api` refuses such an API unless the user says --insecure (K3DEPLOY_INSECURE_API=1), and a
server started here with `auth=True` keeps its auth string in a file only its owner reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from k3deploy.core.errors import K3DeployError

DEFAULT_PORT = 4200
START_TIMEOUT_S = 120.0
INSECURE_ENV = "K3DEPLOY_INSECURE_API"  # what --insecure sets; "1" in a worker's or a script's environment
AUTH_FILE = "prefect-server-auth"  # under home(): the auth string of a server started with auth, mode 0600


class ServerError(K3DeployError):
    """The local Prefect server could not be started or reached."""


class InsecureAPI(K3DeployError):
    """The Prefect API is reached over the network without authentication, and --insecure was not given."""


@dataclass(frozen=True)
class ServerInfo:
    url: str  # the API, http://127.0.0.1:PORT/api
    pid: int | None  # None: a server k3deploy did not start ($PREFECT_API_URL)
    auth_file: str | None = None  # k3deploy's own server started with auth: the file holding its auth string

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


def on_loopback(url: str) -> bool:
    """Whether the API's host is this machine's loopback (`localhost`, 127.0.0.0/8, ::1): nothing else reaches it."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a DNS name: whatever it resolves to, it names a host others may reach
        return False


def exposure(url: str, authenticated: bool) -> str | None:
    """Why talking to this API as configured would serve its secrets to the network; None when it would not."""
    if authenticated or on_loopback(url):
        return None
    return (
        f"the Prefect API at {url} is not on this machine and no auth string is set: whoever reaches it reads "
        "every saved block's secrets and starts runs on the nodes; set PREFECT_API_AUTH_STRING (the server's "
        "PREFECT_SERVER_API_AUTH_STRING), or pass --insecure to use it unauthenticated"
    )


def insecure_allowed() -> bool:
    return os.environ.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes")


def client_authenticated() -> bool:
    """Whether this process's Prefect client sends credentials (an auth string, or a Prefect Cloud key)."""
    from prefect.settings import get_current_settings

    api = get_current_settings().api
    return any(s is not None and s.get_secret_value() for s in (api.auth_string, api.key))


def checked_api(url: str, warn: Callable[[str], None]) -> str:
    """`url` once it is safe to talk to, or with --insecure said (then a warning, on every command)."""
    reason = None if on_loopback(url) else exposure(url, client_authenticated())
    if reason is None:
        return url
    if not insecure_allowed():
        raise InsecureAPI(reason)
    warn(f"warning: --insecure: talking to the Prefect API at {url} without authentication; whoever reaches it "
         "can read the saved blocks' secrets and start runs")  # fmt: skip
    return url


def _free_port(host: str, preferred: int) -> int:
    """`preferred` if a server can listen there, else any free port. Probed as uvicorn binds (SO_REUSEADDR): a
    server restarted on its port finds it free while the old connections linger in TIME_WAIT."""
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise ServerError(f"no free port on {host} for a Prefect server")


def recorded() -> ServerInfo | None:
    """The server this machine's k3deploy started earlier, if it still answers."""
    try:
        data = json.loads(_state_file().read_text())
        info = ServerInfo(str(data["url"]), int(data["pid"]), data.get("auth_file"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if healthy(info.url) else None


def _auth_string(path: Path) -> str:
    """The server's auth string, made once (random, 32 bytes) in a file only its owner can read."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    if path.stat().st_mode & 0o077:
        raise ServerError(f"{path} holds the server's auth string but others may read it: chmod 600 {path}")
    value = path.read_text().strip()
    if not value:
        raise ServerError(f"{path} is empty: remove it and start the server again for a new auth string")
    return value


def start(say: Callable[[str], None], host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          auth: bool = False) -> ServerInfo:  # fmt: skip
    """Start `prefect server start` in its own session (with auth: basic authentication on its API); wait until
    /api/health answers. An address other than loopback needs auth, or --insecure.

    One start at a time on this machine: a port is chosen free, but the server binds it seconds later, and a
    second k3deploy (another user's home, a CI job beside) would choose the same one and then take the first
    server's answers for its own."""
    with _machine_lock("server-start"):
        return _start(say, host, port, auth)


@contextlib.contextmanager
def _machine_lock(name: str) -> Iterator[None]:
    """An exclusive lock shared by every k3deploy on this machine, whatever its home; the holder's own
    deadline bounds the wait."""
    with open(Path(tempfile.gettempdir()) / f"k3deploy-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _start(say: Callable[[str], None], host: str, port: int, auth: bool) -> ServerInfo:
    address = f"[{host}]" if ":" in host else host
    port = _free_port(host, port)
    url = f"http://{address}:{port}/api"
    if not auth and not on_loopback(url):
        if not insecure_allowed():
            raise InsecureAPI(
                f"a server on {host} without --auth serves every saved block's secrets and the runs to whoever "
                "reaches it: add --auth, or pass --insecure to serve it unauthenticated"
            )
        say(f"warning: --insecure: serving the Prefect API on {host} without authentication")
    folder = home()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "prefect-server.log"
    auth_file = folder / AUTH_FILE
    env = {
        **os.environ,
        "PREFECT_HOME": str(folder / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": url,
        # The UI's pages call the API at this URL (Prefect's default is port 4200 whatever port it serves on):
        # without it, a server on another port shows empty pages, or another server's runs.
        "PREFECT_UI_API_URL": url,
    }
    if auth:
        env["PREFECT_SERVER_API_AUTH_STRING"] = env["PREFECT_API_AUTH_STRING"] = _auth_string(auth_file)
    say(f"starting a local Prefect server at {url.removesuffix('/api')} (once; `k3deploy server stop` stops it)")
    if auth:
        say(f"its API asks for the auth string kept in {auth_file} (mode 0600): give it to workers and users as "
            "PREFECT_API_AUTH_STRING; the UI asks for it once")  # fmt: skip
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)]
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
    info = ServerInfo(url, proc.pid, str(auth_file) if auth else None)
    _state_file().write_text(json.dumps({"url": info.url, "pid": info.pid, "auth_file": info.auth_file}))
    return info


def ensure(say: Callable[[str], None]) -> ServerInfo:
    """The server to use: $PREFECT_API_URL (refused when it would serve secrets to the network), else ours
    (started now, on loopback, if it is not running)."""
    given = os.environ.get("PREFECT_API_URL")
    if given:
        return ServerInfo(checked_api(given.rstrip("/"), say), None)
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
    if info.auth_file is not None:  # our own server, started with auth: its string, read from its file
        os.environ["PREFECT_API_AUTH_STRING"] = _auth_string(Path(info.auth_file))
    refresh_global_settings_context()
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
