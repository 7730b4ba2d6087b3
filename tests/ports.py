"""Whether a loopback port is free: what "nothing left listening" means in the tests."""

from __future__ import annotations

import socket


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
