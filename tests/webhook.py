"""A real webhook receiver on a local address: every POST's path and JSON body, in arrival order."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Received = queue.Queue[tuple[str, dict[str, Any]]]


@contextmanager
def receiving(host: str = "127.0.0.1", path: str = "/hooks/x") -> Iterator[tuple[str, Received]]:
    """The receiver's URL (with `path`, where chat tools put their token) and what it received."""
    received: Received = queue.Queue()

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.put((self.path, json.loads(body)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}{path}", received
    finally:
        server.shutdown()
        server.server_close()


def delivered(received: Received) -> list[tuple[str, dict[str, Any]]]:
    """What arrived so far."""
    out = []
    while not received.empty():
        out.append(received.get_nowait())
    return out
