"""Whether a loopback port is free: what "nothing left listening" means in the tests."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nobody listens and a server can bind it (SO_REUSEADDR, as servers do: closed connections
    linger in TIME_WAIT, which only a bind without it would trip over)."""
    with socket.socket() as probe:
        if probe.connect_ex((host, port)) == 0:
            return False
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def in_this_netns(proc: Path) -> bool:
    """Whether a /proc/PID folder's process shares our network namespace: the loopback and ports we look at.
    The bed's hosts (and their containers) each have their own, and may run the same programs meanwhile."""
    try:
        return os.readlink(proc / "ns" / "net") == os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def started_here(proc: Path, test_file: str) -> bool:
    """Whether a /proc/PID folder's process was started by a test of `test_file` (e.g. "test_x.py"), by the
    PYTEST_CURRENT_TEST it inherited: the other worker's tests run the same programs meanwhile. A process
    without one (or gone) counts as this test's, so a check that uses this never looks away from a leftover."""
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return True
    for entry in environ:
        if entry.startswith(b"PYTEST_CURRENT_TEST="):
            return test_file.encode() in entry
    return True
