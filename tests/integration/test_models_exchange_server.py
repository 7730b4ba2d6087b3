"""What a node's exchange server gives to whom: verified files of this checkpoint, to holders of the run's token.

The real server of node_exchange.py on loopback, asked by a plain HTTP client.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.tasks.node.node_agent import Expected
from k3deploy.tasks.node.node_exchange import _Holdings, _Server

pytestmark = [pytest.mark.models, pytest.mark.anywhere]
TOKEN = "run-token-123"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, _Holdings]]:
    (tmp_path / "held.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "coming.bin").write_bytes(b"half")
    (tmp_path / "secret.txt").write_text("not part of the checkpoint")
    files = {p: Expected(p, n, None, None) for p, n in (("held.bin", 1024), ("coming.bin", 8), ("lost.bin", 9))}
    holdings = _Holdings(["held.bin"])
    srv = _Server(("127.0.0.1", 0), tmp_path, TOKEN, files, holdings)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_port}", holdings
    finally:
        srv.shutdown()
        srv.server_close()


def get(url: str, token: str | None = TOKEN, **headers: str) -> tuple[int, bytes]:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_only_holders_of_the_run_token_are_answered(server):
    url, _ = server
    for token in (None, "another-run", TOKEN + "x"):
        assert get(f"{url}/file/held.bin", token)[0] == 403
        assert get(f"{url}/ready/held.bin", token)[0] == 403
    assert get(f"{url}/file/held.bin") == (200, bytes(range(256)) * 4)


def test_a_file_is_served_only_once_verified_and_only_if_it_is_of_the_checkpoint(server):
    url, holdings = server
    assert get(f"{url}/file/coming.bin")[0] == 404  # still downloading here
    assert get(f"{url}/file/secret.txt")[0] == 404  # not a file of the listing
    assert get(f"{url}/file/..%2Fsecret.txt")[0] == 404
    assert get(f"{url}/ready/secret.txt")[0] == 404
    threading.Timer(0.2, holdings.mark, ("coming.bin", True)).start()
    assert get(f"{url}/ready/coming.bin") == (200, b'{"state": "ready"}')  # held until it is verified here
    holdings.mark("lost.bin", False, "the hub answered HTTP 503")  # its holder could not get it: says why
    status, body = get(f"{url}/ready/lost.bin")
    assert status == 404 and b"given up" in body and b"the hub answered HTTP 503" in body
    assert get(f"{url}/file/lost.bin")[0] == 404


def test_a_range_resumes_where_the_receiver_stopped(server):
    url, _ = server
    status, body = get(f"{url}/file/held.bin", Range="bytes=1000-")
    assert (status, body) == (206, (bytes(range(256)) * 4)[1000:])
    assert get(f"{url}/file/held.bin", Range="bytes=1024-")[0] == 416
