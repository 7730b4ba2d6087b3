"""What a node's exchange server gives to whom: verified files of this checkpoint, to holders of the run's token.

The real server of node_exchange.py on loopback, asked by a plain HTTP client.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from k3deploy.tasks.node.node_agent import Expected
from k3deploy.tasks.node.node_exchange import BUSY, FANOUT, _Holdings, _Server
from tests.prefect_runs import wait_for

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
        assert get(f"{url}/have", token)[0] == 403
    assert get(f"{url}/file/held.bin") == (200, bytes(range(256)) * 4)


def test_a_file_is_served_only_once_verified_and_only_if_it_is_of_the_checkpoint(server):
    url, holdings = server
    assert get(f"{url}/file/coming.bin")[0] == 404  # still downloading here
    assert get(f"{url}/file/secret.txt")[0] == 404  # not a file of the listing
    assert get(f"{url}/file/..%2Fsecret.txt")[0] == 404
    have = json.loads(get(f"{url}/have")[1])
    assert have == {"ready": ["held.bin"], "gave_up": {}, "sending": {}, "from_hub": [], "slow": []}
    holdings.mark("coming.bin", True)  # verified here now: told, and served
    assert json.loads(get(f"{url}/have")[1])["ready"] == ["coming.bin", "held.bin"]
    holdings.mark("lost.bin", False, "the hub answered HTTP 503")  # its holder could not get it: says why
    assert json.loads(get(f"{url}/have")[1])["gave_up"] == {"lost.bin": "the hub answered HTTP 503"}
    assert get(f"{url}/file/lost.bin")[0] == 404


def test_a_file_goes_to_fanout_peers_at_once_and_the_next_is_told_busy(server):
    url, holdings = server
    for _ in range(FANOUT):
        assert holdings.claim("held.bin")  # sending to FANOUT peers now
    assert json.loads(get(f"{url}/have")[1])["sending"] == {"held.bin": FANOUT}
    status, body = get(f"{url}/file/held.bin")
    assert status == BUSY and b"busy" in body
    holdings.release("held.bin")
    assert get(f"{url}/file/held.bin") == (200, bytes(range(256)) * 4)
    # the handler frees its slot once its send returns, which may be just after the client has every byte
    sending = lambda: json.loads(get(f"{url}/have")[1])["sending"] == {"held.bin": FANOUT - 1}  # noqa: E731
    wait_for("the finished send's slot to be free again", sending, timeout=30)  # the one still going remains


def test_a_range_resumes_where_the_receiver_stopped(server):
    url, _ = server
    status, body = get(f"{url}/file/held.bin", Range="bytes=1000-")
    assert (status, body) == (206, (bytes(range(256)) * 4)[1000:])
    assert get(f"{url}/file/held.bin", Range="bytes=1024-")[0] == 416
