"""Processes of the bed: running commands, starting daemons, waiting, stopping.

Daemons are found again by the namespaces they live in (and by their own
config paths), never by process name, so `down` ends only what the bed started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from .layout import HOST_PATH

CLEAN_ENV = {"PATH": HOST_PATH, "HOME": "/root", "LANG": "C.UTF-8", "USER": "root", "LOGNAME": "root"}


class BedError(RuntimeError):
    """The bed could not be brought up or torn down; the message says what to fix."""


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command (argv list, no shell) and fail with its stderr when it fails."""
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            input=input,
            check=False,
        )
    except FileNotFoundError as exc:
        raise BedError(f"{argv[0]}: not installed ({exc})") from None
    except subprocess.TimeoutExpired:
        raise BedError(f"timed out after {timeout}s: {' '.join(argv)}") from None
    if check and proc.returncode != 0:
        raise BedError(f"failed (rc {proc.returncode}): {' '.join(argv)}\n{proc.stderr.strip()}")
    return proc


def spawn(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a long-running daemon in its own session, output to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env if env is not None else CLEAN_ENV),
            start_new_session=True,
            close_fds=True,
        )


def wait_until(
    what: str,
    probe: Callable[[], bool],
    timeout: float,
    interval: float = 0.05,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Poll `probe()` until it returns true; raise BedError naming `what` on timeout.

    With `proc`, give up at once if that daemon has exited, showing the end of `log`.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            raise BedError(f"{what}: the daemon exited with rc {proc.returncode}\n{tail}")
        try:
            if probe():
                return
        except OSError as exc:
            last = exc
        time.sleep(interval)
    raise BedError(f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last})" if last else ""))


def ssh_banner(ip: str, port: int, timeout: float = 1.0) -> bool:
    """True when an SSH server answers with its version banner."""
    with socket.create_connection((ip, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        return sock.recv(64).startswith(b"SSH-2.0-")


def http_over_unix(path: str, request_path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """A bare HTTP/1.0 GET over a UNIX socket (the Podman API), returning status and body."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(f"GET {request_path} HTTP/1.0\r\nHost: d\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, body


def podman_ready(sock: str) -> bool:
    return os.path.exists(sock) and http_over_unix(sock, "/_ping") == (200, b"OK")


def http_ok(ip: str, port: int, path: str, timeout: float = 1.0) -> bool:
    with socket.create_connection((ip, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode())
        return sock.recv(32).startswith((b"HTTP/1.0 200", b"HTTP/1.1 200"))


def ns_inode(path: str | os.PathLike[str]) -> int | None:
    """Inode of a namespace file (a bind mount of nsfs), or None if absent."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _proc_table() -> dict[int, tuple[int, dict[str, int], str]]:
    """pid -> (ppid, {ns kind: inode}, cmdline) for every readable process."""
    table: dict[int, tuple[int, dict[str, int], str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            ns = {kind: os.stat(f"/proc/{pid}/ns/{kind}").st_ino for kind in ("net", "mnt", "uts")}
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        table[pid] = (ppid, ns, cmd)
    return table


def bed_pids(ns_inodes: Iterable[int], cmdline_marks: Iterable[str]) -> list[int]:
    """Processes inside the bed's namespaces or naming its files, plus all their descendants;
    never this process or its ancestors (a test run inside a bed host must not kill itself)."""
    inodes = set(ns_inodes)
    marks = [m for m in cmdline_marks if m]
    table = _proc_table()
    me = os.getpid()
    roots = {
        pid
        for pid, (_ppid, ns, cmd) in table.items()
        if pid != me and (inodes & set(ns.values()) or any(m in cmd for m in marks))
    }
    children: dict[int, list[int]] = {}
    for pid, (ppid, _ns, _cmd) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid in found or pid == me:
            continue
        found.add(pid)
        stack.extend(children.get(pid, []))
    mine, pid = set(), me
    while pid in table and pid not in mine:
        mine.add(pid)
        pid = table[pid][0]
    return sorted(found - mine)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _reap(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def kill_pids(pids: Sequence[int], grace: float = 2.0) -> list[int]:
    """SIGTERM, then SIGKILL what is left after `grace` seconds; returns survivors."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 3.0)):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pids)
            if not any(_alive(p) for p in pids):
                return []
            time.sleep(0.05)
    _reap(pids)
    return [p for p in pids if _alive(p)]
