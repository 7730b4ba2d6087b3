"""Hashing and per-file checks, on real files."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from k3deploy.tasks.models.listing import Listing, RemoteFile, ms_file
from k3deploy.tasks.node.node_agent import CHUNK, check_file, sha256_file, verify_checkpoint

pytestmark = pytest.mark.models


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 17])
def test_sha256_matches_hashlib_across_chunk_boundaries(tmp_path: Path, size: int):
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    assert sha256_file(path, chunk=4096) == hashlib.sha256(data).hexdigest()


def test_git_blob_id_matches_git(tmp_path: Path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"hidden_size": 64}\n')
    expected = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
    blob = expected.stdout.strip()
    assert check_file(tmp_path, RemoteFile("config.json", path.stat().st_size, None, blob)).ok
    assert "does not match the hub's" in check_file(tmp_path, RemoteFile("config.json", 20, None, "0" * 40)).problem


def test_check_file_says_what_is_wrong(tmp_path: Path):
    (tmp_path / "a.bin").write_bytes(b"abc")
    good = RemoteFile("a.bin", 3, hashlib.sha256(b"abc").hexdigest(), None)
    assert check_file(tmp_path, good).ok
    assert check_file(tmp_path, RemoteFile("b.bin", 3, good.sha256, None)).problem == "missing"
    assert "size 3 bytes, hub says 4" in check_file(tmp_path, RemoteFile("a.bin", 4, good.sha256, None)).problem
    bad = check_file(tmp_path, RemoteFile("a.bin", 3, "0" * 64, None))
    assert not bad.ok and "does not match the hub's 000" in bad.problem
    assert "no checksum" in check_file(tmp_path, RemoteFile("a.bin", 3, None, None)).problem
    results, _, _ = verify_checkpoint(tmp_path, Listing("o/r", "c" * 40, (good, RemoteFile("b.bin", 1, None, None))))
    assert [r.ok for r in results] == [True, False]


def test_modelscope_items_parse():
    item = {"Path": "w/model.safetensors", "Size": 10, "Sha256": "ab" * 32, "Type": "blob", "Id": "x"}
    assert ms_file(item) == RemoteFile("w/model.safetensors", 10, "ab" * 32, "x")
    assert ms_file({"Path": "w", "Size": 0, "Type": "tree"}) is None
