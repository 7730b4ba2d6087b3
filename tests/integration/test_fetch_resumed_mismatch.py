"""A resumed download whose bytes fail the checksum: the bytes kept from before and the new source's rest are
not told apart by a hash, so no source is blamed until it has sent the whole file alone (the node agent's
fetch_file against a real HTTP server on loopback that honours Range, as the hub and the peers do)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from k3deploy.tasks.models.listing import RemoteFile
from k3deploy.tasks.node.node_agent import PARTIAL_DIR, Progress, Source, fetch_file

pytestmark = [pytest.mark.models, pytest.mark.anywhere]
SIZE = 300_000
GOOD = os.urandom(SIZE)
EXPECTED = RemoteFile("shard-1.safetensors", SIZE, hashlib.sha256(GOOD).hexdigest(), None)


@pytest.fixture
def serving() -> Iterator[tuple[dict[str, Any], str]]:
    """A server of one file (what it serves is the test's to set), with Range; what it was asked is kept."""
    state: dict[str, Any] = {"body": GOOD, "ranges": []}

    class File(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body, wanted = state["body"], self.headers.get("Range")
            state["ranges"].append(wanted)
            start = int(wanted.removeprefix("bytes=").split("-")[0]) if wanted else 0
            self.send_response(206 if wanted else 200)
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            self.wfile.write(body[start:])

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), File)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}/file"
    server.shutdown()
    server.server_close()


def keep_partial(root: Path, data: bytes) -> None:
    partial = root / PARTIAL_DIR / (EXPECTED.path + ".part")
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data)


def test_bad_bytes_kept_from_before_and_a_good_rest_start_again_from_zero_blaming_no_one(serving, tmp_path):
    state, url = serving
    keep_partial(tmp_path, b"\0" * 100_000)  # an earlier source's bytes, wrong
    progress = Progress("download", SIZE)
    check = fetch_file(tmp_path, EXPECTED, {}, progress, Source(name="peer node2", url=url, who="node2", retries=0))
    assert check.ok, check.problem
    assert (tmp_path / EXPECTED.path).read_bytes() == GOOD
    assert state["ranges"] == ["bytes=100000-", None]  # the rest, then the whole file from byte 0
    assert check.note.startswith("the 100000 bytes kept from before and the rest from node2 failed the checksum")
    assert "fetched again from byte 0 from node2" in check.note
    assert progress.done == SIZE  # the dropped partial no longer counted as done
    assert progress.sources == {"peer node2": (SIZE - 100_000) + SIZE}  # every byte received, counted


def test_a_source_that_sends_bad_bytes_alone_is_named(serving, tmp_path):
    state, url = serving
    state["body"] = GOOD[:-1] + bytes([GOOD[-1] ^ 1])  # one bit off at the end
    keep_partial(tmp_path, GOOD[:100_000])  # right bytes kept from before: the source's rest is what is bad
    progress = Progress("download", SIZE)
    check = fetch_file(tmp_path, EXPECTED, {}, progress, Source(name="peer node2", url=url, who="node2", retries=0))
    assert not check.ok
    assert state["ranges"] == ["bytes=100000-", None]  # blamed only once it had sent the whole file alone
    assert check.problem.endswith(f"does not match the hub's {EXPECTED.sha256} (from node2)")
    assert "the 100000 bytes kept from before" in check.note
    assert not (tmp_path / PARTIAL_DIR / (EXPECTED.path + ".part")).exists() and not (tmp_path / EXPECTED.path).exists()
    assert progress.done == 0


def test_a_file_sent_whole_by_one_source_is_blamed_at_once(serving, tmp_path):
    state, url = serving
    state["body"] = bytes(SIZE)
    check = fetch_file(tmp_path, EXPECTED, {}, Progress("download", SIZE), Source(url=url, who="node3", retries=0))
    assert not check.ok and check.problem.endswith("(from node3)") and check.note == ""
    assert state["ranges"] == [None]  # no second try: nothing was kept from before
