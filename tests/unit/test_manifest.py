"""Manifests: a rerun re-hashes only what changed; nodes that differ are named."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from k3deploy.tasks.models.checks import differing_nodes
from k3deploy.tasks.models.listing import Listing, RemoteFile
from k3deploy.tasks.node.node_agent import load_manifest, verify_checkpoint, write_manifest

pytestmark = pytest.mark.models


def make_checkpoint(root: Path) -> Listing:
    files = {"config.json": b"{}", "model-1.safetensors": os.urandom(5000), "model-2.safetensors": os.urandom(7000)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    remote = tuple(RemoteFile(n, len(d), hashlib.sha256(d).hexdigest(), None) for n, d in files.items())
    return Listing("org/ckpt", "c" * 40, remote)


def test_rerun_rehashes_only_changed_files(tmp_path: Path):
    listing = make_checkpoint(tmp_path)
    checks, manifest, hashed = verify_checkpoint(tmp_path, listing)
    assert all(c.ok for c in checks) and len(hashed) == 3
    write_manifest(tmp_path, manifest)
    again = load_manifest(tmp_path)
    assert again is not None and again.files == manifest.files and again.commit == "c" * 40

    checks, _, hashed = verify_checkpoint(tmp_path, listing, again)
    assert all(c.ok for c in checks) and hashed == []

    target = tmp_path / "model-2.safetensors"
    data = bytearray(target.read_bytes())
    data[10] ^= 0xFF
    target.write_bytes(bytes(data))
    # Same size; a later mtime, set explicitly since coarse timestamps could repeat within a test.
    mtime = again.files["model-2.safetensors"].mtime_ns + 1_000_000_000
    os.utime(target, ns=(mtime, mtime))
    checks, newer, hashed = verify_checkpoint(tmp_path, listing, again)
    assert hashed == ["model-2.safetensors"]
    assert [c.path for c in checks if not c.ok] == ["model-2.safetensors"]
    assert "model-2.safetensors" not in newer.files


def test_same_mtime_and_size_is_trusted_only_for_the_same_expected_hash(tmp_path: Path):
    listing = make_checkpoint(tmp_path)
    _, manifest, _ = verify_checkpoint(tmp_path, listing)
    moved = Listing(listing.repo, "d" * 40, (RemoteFile("config.json", 2, "0" * 64, None), *listing.files[1:]))
    checks, _, hashed = verify_checkpoint(tmp_path, moved, manifest)
    assert hashed == ["config.json"] and not checks[0].ok


def test_unreadable_manifest_means_hash_everything(tmp_path: Path):
    listing = make_checkpoint(tmp_path)
    (tmp_path / ".k3deploy-manifest.json").write_text("{not json")
    assert load_manifest(tmp_path) is None
    assert len(verify_checkpoint(tmp_path, listing, load_manifest(tmp_path))[2]) == 3


def test_the_node_that_differs_is_named(tmp_path: Path):
    listing = make_checkpoint(tmp_path)
    _, good, _ = verify_checkpoint(tmp_path, listing)
    other_commit = type(good)(good.repo, "e" * 40, dict(good.files))
    missing_file = type(good)(good.repo, good.commit, {k: v for k, v in good.files.items() if k != "config.json"})
    paths = [f.path for f in listing.files]
    diff = differing_nodes({"node0": good, "node1": good, "node2": other_commit, "node3": missing_file}, paths)
    assert set(diff) == {"node2", "node3"}
    assert "commit eeee" in diff["node2"] and "config.json" in diff["node3"]
    assert differing_nodes({"node0": good, "node1": good}, paths) == {}
