"""Real hub clients download from the local hub; our listing + checksum catches what they miss."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from k3deploy.localhub import HubServer, publish
from k3deploy.tasks.models.listing import list_huggingface, list_modelscope
from k3deploy.tasks.node.node_agent import verify_checkpoint

pytestmark = [pytest.mark.models, pytest.mark.faults, pytest.mark.anywhere]
REPO = "k3test/tiny-w4a8"


@pytest.fixture
def hub(tmp_path: Path):
    rnd = random.Random(7)
    files = {
        "config.json": b'{"quantization_config": {"quant_method": "w4a8"}}',
        "tokenizer.json": rnd.randbytes(2000),
        "model-00001.safetensors": rnd.randbytes(1024 * 1024 + 99),
    }
    commit = publish(tmp_path / "hub", REPO, files)
    with HubServer(tmp_path / "hub") as server:
        yield server, commit, files


@pytest.mark.parametrize("victim", ["model-00001.safetensors", "tokenizer.json"])
def test_corruption_the_hf_client_accepts_is_caught_and_named(hub, tmp_path: Path, victim: str):
    server, commit, files = hub
    server.faults.corrupt(REPO, victim)
    local = tmp_path / "dl"
    snapshot_download(REPO, revision="main", local_dir=local, endpoint=server.url, cache_dir=tmp_path / "c")
    assert (local / victim).read_bytes() != files[victim]  # the client kept the corrupted bytes
    server.faults.clear()
    listing = list_huggingface(REPO, "main", server.url, None)
    assert listing.commit == commit
    results = {r.path: r for r in verify_checkpoint(local, listing)[0]}
    assert set(results) == set(files)
    assert [p for p, r in results.items() if not r.ok] == [victim]
    kind = "sha256" if victim.endswith(".safetensors") else "git blob id"
    assert results[victim].problem.startswith(kind)


def test_modelscope_listing_verifies_a_modelscope_download(hub, tmp_path: Path, monkeypatch):
    from modelscope import snapshot_download as ms_snapshot_download
    from modelscope_hub.config import set_default_config

    server, commit, files = hub
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", server.url)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms-cache"))
    set_default_config(None)
    local = Path(ms_snapshot_download(REPO, revision="main", local_dir=str(tmp_path / "ms")))
    listing = list_modelscope(REPO, "main", server.url, None)
    assert listing.commit == commit and listing.total_bytes == sum(len(b) for b in files.values())
    assert all(r.ok for r in verify_checkpoint(local, listing)[0])
    (local / "config.json").write_bytes(b'{"quantization_config": {"quant_method": "w8a8"}}')
    assert [r.path for r in verify_checkpoint(local, listing)[0] if not r.ok] == ["config.json"]
