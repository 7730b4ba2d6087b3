"""The node agent against the local hub, on this machine (LocalTransport): the download paths in detail."""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from k3deploy.localhub import HubServer, publish
from k3deploy.tasks.models.listing import download_urls, list_huggingface, list_modelscope
from k3deploy.tasks.models.remote import job, run_agent
from k3deploy.tasks.node.node_agent import MANIFEST_NAME, PARTIAL_DIR
from k3deploy.tasks.transport import LocalTransport

pytestmark = [pytest.mark.models, pytest.mark.faults, pytest.mark.anywhere]
REPO = "k3test/agent"
BIG = "model-00001.safetensors"


@pytest.fixture
def hub(tmp_path: Path):
    rnd = random.Random(11)
    files = {"config.json": b'{"vocab_size": 10}', "tokenizer.json": rnd.randbytes(4000), BIG: rnd.randbytes(3 << 20)}
    publish(tmp_path / "hub", REPO, files)
    with HubServer(tmp_path / "hub") as server:
        yield server, files


def fetch_all(server: HubServer, hub_name: str, root: Path):
    lister = list_huggingface if hub_name == "huggingface" else list_modelscope
    listing = lister(REPO, "main", server.url, None)
    urls = download_urls(hub_name, listing, "main", server.url)
    body = job("fetch", str(root), listing, urls=urls, fetch=[f.path for f in listing.files])
    reports = run_agent({"local": LocalTransport("local")}, sys.executable, {"local": body}, 60, "fetching")
    return listing, reports["local"]


@pytest.mark.parametrize("hub_name", ["huggingface", "modelscope"])
def test_a_cut_connection_is_resumed_with_a_range_request(hub, tmp_path: Path, hub_name: str):
    server, files = hub
    server.faults.truncate(REPO, BIG, at=1 << 20, times=1)
    listing, report = fetch_all(server, hub_name, tmp_path / "m")
    assert all(c.ok for c in report.checks), report.checks
    ranges = [r.range for r in server.requests if r.method == "GET" and BIG in r.path]
    assert ranges[0] is None and ranges[1].startswith("bytes=") and int(ranges[1][6:-1]) >= 1 << 20
    assert hashlib.sha256((tmp_path / "m" / BIG).read_bytes()).hexdigest() == hashlib.sha256(files[BIG]).hexdigest()
    assert report.manifest is not None and report.manifest.commit == listing.commit
    assert not (tmp_path / "m" / PARTIAL_DIR).exists()  # no empty partial folder left in the checkpoint


def test_corrupt_bytes_from_the_hub_never_land_in_place(hub, tmp_path: Path):
    server, _ = hub
    server.faults.corrupt(REPO, BIG)
    _, report = fetch_all(server, "huggingface", tmp_path / "m")
    bad = {c.path: c.problem for c in report.checks if not c.ok}
    assert list(bad) == [BIG] and bad[BIG].startswith("downloaded file: sha256 ")
    assert not (tmp_path / "m" / BIG).exists()  # neither in place nor vouched for by the manifest
    assert BIG not in (tmp_path / "m" / MANIFEST_NAME).read_text()
    assert report.manifest is not None and report.manifest.commit == ""  # not complete at any commit


def test_a_redirect_to_another_host_keeps_range_and_drops_the_token(tmp_path: Path):
    """As huggingface.co serves large files from another host: the agent follows the 302, resumes there with a
    Range request, and sends the hub token only to the hub."""
    from k3deploy.tasks.models.listing import auth_headers

    rnd = random.Random(5)
    files = {"config.json": b'{"vocab_size": 10}', BIG: rnd.randbytes(3 << 20)}
    publish(tmp_path / "hub", REPO, files)
    with HubServer(tmp_path / "hub") as cdn, HubServer(tmp_path / "hub", lfs_redirect=cdn.url) as hub:
        cdn.faults.truncate(REPO, BIG, at=1 << 20, times=1)
        listing = list_huggingface(REPO, "main", hub.url, None)
        urls = download_urls("huggingface", listing, "main", hub.url)
        token = auth_headers(SecretStr("hf_k3test_token"))
        body = job(
            "fetch", str(tmp_path / "m"), listing, urls=urls, fetch=[f.path for f in listing.files], headers=token
        )
        report = run_agent({"local": LocalTransport("local")}, sys.executable, {"local": body}, 60, "fetching")["local"]
        assert all(c.ok for c in report.checks), report.checks
        redirected = [r for r in hub.requests if r.method == "GET" and BIG in r.path]
        served = [r for r in cdn.requests if r.method == "GET" and BIG in r.path]
    assert {r.status for r in redirected} == {302} and all(r.authorized for r in redirected)
    assert len(served) == 2 and served[1].range is not None and served[1].range.startswith("bytes=")  # resumed there
    assert not any(r.authorized for r in cdn.requests)  # the token never reached the other host
    assert (tmp_path / "m" / BIG).read_bytes() == files[BIG]


def fetch_big(server: HubServer, root: Path, **options: float):
    """Fetch every file with the agent's retry settings given (read_timeout_s, retries)."""
    listing = list_huggingface(REPO, "main", server.url, None)
    urls = download_urls("huggingface", listing, "main", server.url)
    body = job("fetch", str(root), listing, urls=urls, fetch=[f.path for f in listing.files], **options)
    return run_agent({"local": LocalTransport("local")}, sys.executable, {"local": body}, 60, "fetching")["local"]


def big_gets(server: HubServer) -> list[tuple[str | None, int]]:
    return [(r.range, r.status) for r in server.requests if r.method == "GET" and BIG in r.path]


def test_transient_5xx_is_retried_with_backoff_and_the_file_lands(hub, tmp_path: Path):
    server, files = hub
    server.faults.fail(REPO, BIG, status=503, times=2)
    report = fetch_big(server, tmp_path / "m", retries=2)
    assert all(c.ok for c in report.checks), report.checks
    assert big_gets(server) == [(None, 503), (None, 503), (None, 200)]
    assert (tmp_path / "m" / BIG).read_bytes() == files[BIG]


def test_5xx_beyond_the_retries_fails_the_file_naming_the_status(hub, tmp_path: Path):
    server, _ = hub
    server.faults.fail(REPO, BIG, status=500, times=None)
    report = fetch_big(server, tmp_path / "m", retries=2)
    bad = {c.path: c.problem for c in report.checks if not c.ok}
    assert bad == {
        BIG: "download failed after 3 attempt(s), before any byte: the hub answered HTTP 500 Internal Server Error"
    }
    assert big_gets(server) == [(None, 500)] * 3
    assert not (tmp_path / "m" / BIG).exists() and BIG not in (tmp_path / "m" / MANIFEST_NAME).read_text()


def test_a_stalled_hub_is_timed_out_and_the_file_resumed_with_range(hub, tmp_path: Path):
    """The hub sends 1 MiB, then nothing with the connection open: the read timeout ends the wait, the rest comes
    with a Range request from the exact byte where the bytes stopped."""
    server, files = hub
    at = 1 << 20
    server.faults.stall(REPO, BIG, at=at, times=None)  # every transfer from before `at` stalls there, until cleared
    try:
        report = fetch_big(server, tmp_path / "m", read_timeout_s=1, retries=1)
    finally:
        server.faults.clear()
    assert all(c.ok for c in report.checks), report.checks
    assert big_gets(server) == [(None, 200), (f"bytes={at}-", 206)]
    assert (tmp_path / "m" / BIG).read_bytes() == files[BIG]
    assert not any((tmp_path / "m" / PARTIAL_DIR).rglob("*.part"))


def test_a_stall_with_no_retries_left_is_named_and_the_partial_kept(hub, tmp_path: Path):
    server, files = hub
    at = 1 << 20
    server.faults.stall(REPO, BIG, at=at, times=None)
    try:
        report = fetch_big(server, tmp_path / "m", read_timeout_s=1, retries=0)
    finally:
        server.faults.clear()
    bad = {c.path: c.problem for c in report.checks if not c.ok}
    size = len(files[BIG])
    assert bad == {
        BIG: f"download failed after 1 attempt(s), at byte {at} of {size}: the hub sent nothing for 1 s (read timeout)"
    }
    partial = tmp_path / "m" / PARTIAL_DIR / f"{BIG}.part"
    assert partial.read_bytes() == files[BIG][:at]  # exactly what arrived, for the next run to resume
    assert not (tmp_path / "m" / BIG).exists()
