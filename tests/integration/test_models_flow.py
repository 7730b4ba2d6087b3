"""The models flow on the test bed: real sshd hosts, the local hub, a real Prefect server.

Each test publishes its own small checkpoint (a repo of its own, so its own path on the nodes)
with the files the content checks look for, and runs the `models` flow against four hosts.
"""

from __future__ import annotations

import hashlib
import json
import random
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3deploy.errors import K3DeployError, ModelsStageFailed
from k3deploy.flows.models import models
from k3deploy.localhub import HubServer, publish
from k3deploy.stage import StageResult, failure_lines
from k3deploy.tasks.models.node_agent import MANIFEST_NAME, PARTIAL_DIR
from k3deploy.tasks.transport import SSHTransport
from tests.bedconfig import bed_config, bed_transports, write_config
from tests.checkpoints import SHARD, checkpoint_files
from tests.prefect_runs import task_states

pytestmark = [pytest.mark.models, pytest.mark.testbed, pytest.mark.prefect]
TEST_CHECKPOINTS = ("fresh", "corrupt", "revisions", "nospace", "resume", "bitrot", "nomanifest")


@pytest.fixture(scope="module")
def hub(testbed, tmp_path_factory) -> Iterator[HubServer]:
    """The local hub on the bed's bridge address, where every test host can reach it."""
    with HubServer(tmp_path_factory.mktemp("hub"), host=testbed.state.bridge["ip"]) as server:
        yield server


@pytest.fixture
def nodes(testbed) -> Iterator[dict[str, SSHTransport]]:
    """SSH to the four hosts; every checkpoint a test makes under /srv/models is gone before and after it."""
    ts = bed_transports(testbed)
    for t in ts.values():
        sh(t, f"rm -rf {' '.join(f'/srv/models/{name}' for name in TEST_CHECKPOINTS)}")
    yield ts
    for t in ts.values():
        sh(t, f"rm -rf {' '.join(f'/srv/models/{name}' for name in TEST_CHECKPOINTS)}")
        t.close()


def sh(transport: SSHTransport, command: str) -> str:
    return transport.run(command, 30).check().stdout


def as_record(result: StageResult) -> dict[str, Any]:
    """The stage data with its verdict and failure lines, as the tests read them."""
    return result.data | {"verdict": result.verdict.value, "problems": failure_lines(result.findings)}


def run_models(tmp_path: Path, bed, hub: HubServer, repo: str, hosts: int = 4, **changes: Any) -> dict[str, Any]:
    download = changes.pop("download", True)
    full_verify = changes.pop("full_verify", False)
    data = bed_config(
        bed,
        hosts,
        models__hub="huggingface",
        models__hub_endpoint=hub.url,
        models__target={"repo": repo, **changes.pop("target", {})},
        **changes,
    )
    config = write_config(tmp_path / f"deploy-{random.randrange(10**9)}.yaml", data)
    result = models(config=config, download=download, full_verify=full_verify)
    return as_record(result)


def file_gets(hub: HubServer, repo: str) -> list[tuple[str, str | None]]:
    """Downloads of file contents the hub served for `repo`: (file, Range header)."""
    out = []
    for r in hub.requests:
        prefix = f"/{repo}/resolve/"
        if r.method == "GET" and r.path.startswith(prefix):
            out.append((r.path[len(prefix) :].split("/", 1)[1], r.range))
    return out


def node_sha256(transport: SSHTransport, path: str) -> str:
    return sh(transport, f"sha256sum {shlex.quote(path)}").split()[0]


def test_fresh_download_verifies_on_every_node_and_a_rerun_skips_verified_work(
    prefect_server, testbed, hub, nodes, tmp_path
):
    repo = "k3test/fresh"
    files = checkpoint_files(1)
    commit = publish(hub.root, repo, files)
    hub.clear_requests()

    record = run_models(tmp_path, testbed, hub, repo)

    assert record["verdict"] == "pass", record["problems"]
    target = record["checkpoints"][0]
    assert (target["commit"], target["files"], target["bytes"]) == (commit, len(files), sum(map(len, files.values())))
    assert {row["node"]: row["downloaded files"] for row in target["nodes"]} == dict.fromkeys(nodes, len(files))
    assert sorted(file_gets(hub, repo)) == sorted((name, None) for name in files for _ in nodes)
    for transport in nodes.values():  # every node holds the hub's bytes and a manifest naming the commit
        assert node_sha256(transport, f"/srv/models/fresh/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest()
        manifest = json.loads(sh(transport, f"cat /srv/models/fresh/{MANIFEST_NAME}"))
        assert manifest["commit"] == commit and set(manifest["files"]) == set(files)
    assert {c["check"]: c["ok"] for c in record["checks"]} == {
        "tokenizer files": True,
        "processor files": True,
        "quantization metadata": True,
    }

    hub.clear_requests()
    again = run_models(tmp_path, testbed, hub, repo)  # the manifests vouch for what the download verified
    assert {row["hashed files"] for row in again["checkpoints"][0]["nodes"]} == {0}
    config = bed_config(testbed, models__hub="huggingface", models__hub_endpoint=hub.url, models__target={"repo": repo})
    state = models(config=write_config(tmp_path / "third.yaml", config), return_state=True)
    assert state.is_completed() and file_gets(hub, repo) == []
    states = task_states(state)
    assert states["verify checkpoint"] == "Cached"  # same sizes and mtimes on the same nodes: not even run
    assert "fetch checkpoint" not in states


def test_corrupted_file_is_named_and_only_it_is_fetched_again(prefect_server, testbed, hub, nodes, tmp_path):
    repo = "k3test/corrupt"
    files = checkpoint_files(2)
    publish(hub.root, repo, files)
    assert run_models(tmp_path, testbed, hub, repo)["verdict"] == "pass"
    victim = f"/srv/models/corrupt/{SHARD}"
    sh(nodes["node2"], f"printf 'X' | dd of={victim} bs=1 seek=1000 conv=notrunc status=none")

    hub.clear_requests()
    with pytest.raises(ModelsStageFailed) as failed:
        run_models(tmp_path, testbed, hub, repo, download=False)
    message = str(failed.value)
    assert "node2: 1 file(s) do not match commit" in message and f"{SHARD}: sha256" in message
    assert "node0" not in message and "node1" not in message and "node3" not in message

    record = run_models(tmp_path, testbed, hub, repo)
    assert record["verdict"] == "pass"
    assert file_gets(hub, repo) == [(SHARD, None)]  # one file, once, for the one node
    downloaded = {row["node"]: row["downloaded files"] for row in record["checkpoints"][0]["nodes"]}
    assert downloaded == {"node0": 0, "node1": 0, "node2": 1, "node3": 0}
    assert node_sha256(nodes["node2"], victim) == hashlib.sha256(files[SHARD]).hexdigest()


def test_node_with_a_different_revision_is_named(prefect_server, testbed, hub, nodes, tmp_path):
    repo = "k3test/revisions"
    old = checkpoint_files(3)
    old_commit = publish(hub.root, repo, old)
    new = old | {SHARD: checkpoint_files(4)[SHARD]}
    new_commit = publish(hub.root, repo, new)
    assert run_models(tmp_path, testbed, hub, repo)["verdict"] == "pass"
    # node2 alone is taken back to the old commit, as an earlier run pinned to it would leave it.
    data = bed_config(
        testbed,
        ["node2"],
        models__hub="huggingface",
        models__hub_endpoint=hub.url,
        models__target={"repo": repo, "revision": old_commit},
    )
    assert models(config=write_config(tmp_path / "node2-old.yaml", data)).verdict == "pass"

    with pytest.raises(ModelsStageFailed) as failed:
        run_models(tmp_path, testbed, hub, repo, download=False)
    message = str(failed.value)
    assert f"node2: 1 file(s) do not match commit {new_commit} (its manifest says commit {old_commit})" in message
    assert not any(f"{other}:" in message for other in ("node0", "node1", "node3"))

    hub.clear_requests()
    record = run_models(tmp_path, testbed, hub, repo)
    assert record["checkpoints"][0]["changed_revision"] == {"node2": old_commit}
    assert file_gets(hub, repo) == [(SHARD, None)]


def test_full_disk_is_refused_before_any_download(prefect_server, testbed, hub, nodes, tmp_path):
    repo = "k3test/nospace"
    publish(hub.root, repo, checkpoint_files(5))
    small = "/srv/models/nospace"
    sh(nodes["node3"], f"mkdir -p {small} && mount -t tmpfs -o size=2m k3test-small {small}")
    try:
        hub.clear_requests()
        with pytest.raises(ModelsStageFailed) as failed:
            run_models(tmp_path, testbed, hub, repo)
        assert "node3: 0.004 GB still to download but only 0.002 GB free" in str(failed.value)
        assert "node0" not in str(failed.value)
        assert file_gets(hub, repo) == []  # refused before a single byte was fetched, on any node
        assert sh(nodes["node0"], "ls -A /srv/models/nospace 2>/dev/null || echo absent").split() == ["absent"]
    finally:
        sh(nodes["node3"], f"umount {small}; rmdir {small}")


def test_interrupted_download_resumes_where_it_stopped(prefect_server, testbed, hub, nodes, tmp_path):
    repo = "k3test/resume"
    files = checkpoint_files(6)
    publish(hub.root, repo, files)
    hub.faults.slow(repo, SHARD, 256 * 1024)  # 12 s for the shard; the nodes kill the download at 4 s
    try:
        with pytest.raises(K3DeployError, match=r"node0: killed on the node after 4s"):
            run_models(tmp_path, testbed, hub, repo, hosts=1, models__timeout_s=4)
    finally:
        hub.faults.clear()
    partial = f"/srv/models/resume/{PARTIAL_DIR}/{SHARD}.part"
    kept = int(sh(nodes["node0"], f"stat -c %s {partial}"))
    assert 0 < kept < len(files[SHARD])

    hub.clear_requests()
    record = run_models(tmp_path, testbed, hub, repo, hosts=1)
    assert record["verdict"] == "pass"
    assert file_gets(hub, repo) == [(SHARD, f"bytes={kept}-")]  # only the rest of the one unfinished file
    assert node_sha256(nodes["node0"], f"/srv/models/resume/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest()
    assert sh(nodes["node0"], f"test -e {partial} && echo left || echo gone").strip() == "gone"


@pytest.mark.faults
def test_a_flipped_byte_with_size_and_mtime_kept_is_found_only_by_a_full_verify_and_reported(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """The quick check trusts size and mtime; a disk that flips a byte passes it. --full-verify does not."""
    repo = "k3test/bitrot"
    files = checkpoint_files(2)
    publish(hub.root, repo, files)
    assert run_models(tmp_path, testbed, hub, repo)["verdict"] == "pass"
    victim = f"/srv/models/bitrot/{SHARD}"
    flip = f"cp -p {victim} /tmp/ref && printf 'X' | dd of={victim} bs=1 seek=1000 conv=notrunc status=none"
    sh(nodes["node1"], f"{flip} && touch -r /tmp/ref {victim} && rm /tmp/ref")  # size and mtime as before

    quick = run_models(tmp_path, testbed, hub, repo)
    assert quick["verdict"] == "pass"  # what the quick check cannot see (the README says so)

    hub.clear_requests()
    full = run_models(tmp_path, testbed, hub, repo, full_verify=True)
    assert full["verdict"] == "pass"  # repaired ...
    want = hashlib.sha256(files[SHARD]).hexdigest()
    (row,) = full["checkpoints"][0]["repaired"]  # ... and reported: node, file, expected and actual hash
    assert (row["node"], row["file"]) == ("node1", SHARD)
    assert f"does not match the hub's {want}" in row["found"] and "sha256 " in row["found"]
    assert file_gets(hub, repo) == [(SHARD, None)]
    hashed = {r["node"]: r["hashed files"] for r in full["checkpoints"][0]["nodes"]}
    assert hashed == dict.fromkeys(("node0", "node1", "node2", "node3"), len(files))  # every file, every node
    assert node_sha256(nodes["node1"], victim) == want


@pytest.mark.faults
def test_a_deleted_manifest_means_hashing_not_a_cache_hit(prefect_server, testbed, hub, nodes, tmp_path):
    repo = "k3test/nomanifest"
    publish(hub.root, repo, checkpoint_files(2))
    assert run_models(tmp_path, testbed, hub, repo)["verdict"] == "pass"
    sh(nodes["node3"], f"rm /srv/models/nomanifest/{MANIFEST_NAME}")
    record = run_models(tmp_path, testbed, hub, repo)
    hashed = {r["node"]: r["hashed files"] for r in record["checkpoints"][0]["nodes"]}
    assert hashed["node3"] > 0 and hashed["node0"] == 0  # node3 had nothing to vouch for its files
