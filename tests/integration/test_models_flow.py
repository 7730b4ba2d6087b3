"""The models flow on the test bed: real sshd hosts, the local hub, a real Prefect server.

Each test publishes its own small checkpoint (a repo of its own, so its own path on the nodes)
with the files the content checks look for, and runs the `models` flow against four hosts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from k3deploy.core.errors import K3DeployError, ModelsStageFailed
from k3deploy.flows.models import models
from k3deploy.localhub import publish
from k3deploy.tasks.node.node_agent import MANIFEST_NAME, PARTIAL_DIR
from k3deploy.tasks.transport import SSHTransport
from tests.bedconfig import bed_config, bed_transports, write_config
from tests.checkpoints import SHARD, checkpoint_files
from tests.modelsbed import file_gets, hub_fixture, node_sha256, poll, sh
from tests.modelsbed import run_models as run_models_striped
from tests.prefect_runs import task_states

pytestmark = [pytest.mark.models, pytest.mark.testbed, pytest.mark.prefect]
# These tests are of each node downloading for itself (models.distribution per-node, and the hub half of a
# striped download); test_models_exchange_bed.py tests the striped download with its peer exchange.
run_models = partial(run_models_striped, models__distribution="per-node")
TEST_CHECKPOINTS = (
    "fresh",
    "corrupt",
    "revisions",
    "nospace",
    "resume",
    "bitrot",
    "nomanifest",
    "diskfill",
    "hubflaky",
    "hubdown",
)


hub = hub_fixture()


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
        "serve.max_model_len": True,  # not checked: the bed's config.json names no length (said in its detail)
        "quantization metadata": True,
    }

    hub.clear_requests()
    again = run_models(tmp_path, testbed, hub, repo)  # the manifests vouch for what the download verified
    assert {row["hashed files"] for row in again["checkpoints"][0]["nodes"]} == {0}
    assert {row["verified by"] for row in again["checkpoints"][0]["nodes"]} == {"this run"}  # it ran, vouched
    config = bed_config(testbed, models__hub="huggingface", models__hub_endpoint=hub.url, models__target={"repo": repo})
    state = models(config=write_config(tmp_path / "third.yaml", config), return_state=True)
    assert state.is_completed() and file_gets(hub, repo) == []
    states = task_states(state)
    assert states["verify checkpoint"] == "Cached"  # same sizes and mtimes on the same nodes: not even run
    rows = state.result().data["checkpoints"][0]["nodes"]  # and the record says whose verification it is
    assert {r["verified by"] for r in rows} == {"an earlier run (cache hit: sizes and mtimes unchanged)"}
    assert {r["hashed files"] for r in rows} == {0} and {r["verify s"] for r in rows} == {None}
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


@pytest.mark.faults
def test_model_root_filling_up_mid_download_names_node_and_file_and_a_rerun_resumes(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """The free-space check passes, then something else fills node3's model root while the shard downloads.

    Deterministic: every node's shard transfer stalls at 1 MiB (hub fault) until node3 holds that MiB and every
    other file; then the disk is filled to the last byte and the transfers go on."""
    repo, at = "k3test/diskfill", 1 << 20
    files = checkpoint_files(7)
    commit = publish(hub.root, repo, files)
    root = "/srv/models/diskfill"
    partial, node3 = f"{root}/{PARTIAL_DIR}/{SHARD}.part", nodes["node3"]
    sh(node3, f"mkdir -p {root} && mount -t tmpfs -o size=8m k3test-fill {root}")  # 8 MB: room for 4.2 MB
    hub.faults.stall(repo, SHARD, at=at, times=None)
    others = set(files) - {SHARD}

    def node3_waits_at_the_stall() -> bool:
        out = sh(node3, f"stat -c %s {partial} 2>/dev/null; echo; cat {root}/{MANIFEST_NAME} 2>/dev/null || true")
        size, _, manifest = out.partition("\n")
        landed = set(json.loads(manifest)["files"]) if manifest.strip() else set()
        return size.strip() == str(at) and landed == others

    def fill_when_stalled() -> str:
        try:
            poll("node3 holds 1 MiB of the shard and every other file", node3_waits_at_the_stall, deadline_s=300)
            sh(node3, f"dd if=/dev/zero of={root}/filler bs=4k status=none 2>/dev/null; true")
            return sh(node3, f"df --output=avail -B1 {root} | tail -1").strip()
        finally:
            hub.faults.clear(repo, SHARD)  # the stalled transfers go on: node3's into a full disk

    try:
        hub.clear_requests()
        failed: ModelsStageFailed | None = None
        with ThreadPoolExecutor(1) as pool:
            filler = pool.submit(fill_when_stalled)
            try:
                run_models(tmp_path, testbed, hub, repo)
            except ModelsStageFailed as err:
                failed = err
            assert filler.result() == "0"  # the disk was full to the last byte when the shard went on
        assert failed is not None, "the stage passed on a full disk"
        message = str(failed)
        assert message.startswith("models failed:")
        assert (
            f"node3: 1 file(s) of commit {commit} could not be downloaded: {SHARD}: cannot write {partial}: "
            f"No space left on device (ENOSPC); {at} of {len(files[SHARD])} bytes kept there, "
            "the next run resumes from them"
        ) in message
        assert "Traceback" not in message and not any(f"{n}:" in message for n in ("node0", "node1", "node2"))
        rows = {r["node"]: r["downloaded files"] for r in failed.result.data["checkpoints"][0]["nodes"]}
        assert rows == {"node0": len(files), "node1": len(files), "node2": len(files), "node3": len(files) - 1}
        want = hashlib.sha256(files[SHARD]).hexdigest()
        for name in ("node0", "node1", "node2"):  # the other nodes are unaffected
            assert node_sha256(nodes[name], f"{root}/{SHARD}") == want
        # Nothing half-written in place, nothing vouched for that is not whole, no stray temporary file.
        assert sh(node3, f"test -e {root}/{SHARD} && echo there || echo absent").strip() == "absent"
        assert int(sh(node3, f"stat -c %s {partial}")) == at
        assert SHARD not in json.loads(sh(node3, f"cat {root}/{MANIFEST_NAME}"))["files"]
        assert sh(node3, f"ls -A {root} | grep -c '\\.tmp$' || true").strip() == "0"

        hub.clear_requests()  # a rerun on the still-full disk is refused by the space check, before any byte
        with pytest.raises(ModelsStageFailed) as refused:
            run_models(tmp_path, testbed, hub, repo)
        missing = (len(files[SHARD]) - at) / 1e9
        assert f"node3: {missing:.3f} GB still to download but only 0.000 GB free" in str(refused.value)
        assert file_gets(hub, repo) == []

        sh(node3, f"rm {root}/filler")
        hub.clear_requests()
        record = run_models(tmp_path, testbed, hub, repo)
        assert record["verdict"] == "pass", record["problems"]
        assert file_gets(hub, repo) == [(SHARD, f"bytes={at}-")]  # resumed: only the rest of the one file
        assert node_sha256(node3, f"{root}/{SHARD}") == want
        assert sh(node3, f"test -e {partial} && echo left || echo gone").strip() == "gone"
    finally:
        hub.faults.clear()
        sh(node3, f"umount {root}; rmdir {root}")


@pytest.mark.faults
def test_hub_5xx_and_a_stall_mid_download_are_retried_and_resumed(prefect_server, testbed, hub, nodes, tmp_path):
    """Two 503s on one file, and every node's shard transfer stalling at 1 MiB with the connection open: the nodes
    retry, time the stalled read out, resume with Range from the byte where it stopped, and the stage passes."""
    repo, at, small = "k3test/hubflaky", 1 << 20, "model-00002-of-00002.safetensors"
    files = checkpoint_files(8)
    publish(hub.root, repo, files)
    hub.faults.fail(repo, small, status=503, times=2)
    hub.faults.stall(repo, SHARD, at=at, times=None)  # until cleared: only the nodes' read timeout ends it
    hub.clear_requests()
    try:
        # the stall lasts until cleared; 8 s, so that no healthy read on a busy machine is timed out as one
        record = run_models(tmp_path, testbed, hub, repo, models__read_timeout_s=8)
    finally:
        hub.faults.clear()
    assert record["verdict"] == "pass", record["problems"]
    assert {r["node"]: r["downloaded files"] for r in record["checkpoints"][0]["nodes"]} == dict.fromkeys(
        nodes, len(files)
    )
    shard = sorted((r.range or "", r.status) for r in hub.requests if r.method == "GET" and r.path.endswith(SHARD))
    assert shard == [("", 200)] * 4 + [(f"bytes={at}-", 206)] * 4  # each node: the stalled GET, then the rest
    smalls = [r.status for r in hub.requests if r.method == "GET" and r.path.endswith(small)]
    assert sorted(smalls) == [200] * 4 + [503] * 2
    for transport in nodes.values():
        assert node_sha256(transport, f"/srv/models/hubflaky/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest()


@pytest.mark.faults
def test_hub_failing_beyond_the_retries_fails_naming_node_file_and_status(
    prefect_server, testbed, hub, nodes, tmp_path
):
    repo = "k3test/hubdown"
    files = checkpoint_files(9)
    commit = publish(hub.root, repo, files)
    hub.faults.fail(repo, SHARD, status=503, times=None)
    hub.clear_requests()
    try:
        with pytest.raises(ModelsStageFailed) as failed:
            run_models(tmp_path, testbed, hub, repo, hosts=2, models__download_retries=2)  # 3 attempts
    finally:
        hub.faults.clear()
    message = str(failed.value)
    for node in ("node0", "node1"):
        assert (
            f"{node}: 1 file(s) of commit {commit} could not be downloaded: {SHARD}: download failed after "
            "3 attempt(s), before any byte: the hub answered HTTP 503 Service Unavailable"
        ) in message
    assert [(r.range, r.status) for r in hub.requests if r.method == "GET" and r.path.endswith(SHARD)] == [
        (None, 503)
    ] * 6
    for transport in list(nodes.values())[:2]:  # nothing in place, nothing partial: not a byte came
        assert sh(transport, f"find /srv/models/hubdown -name '{SHARD}*'") == ""
        assert sh(transport, "find /srv/models/hubdown -name 'model-00002*'").strip()  # the other shard landed

    hub.clear_requests()  # the hub is well again: the rerun fetches the one file on each node
    record = run_models(tmp_path, testbed, hub, repo, hosts=2)
    assert record["verdict"] == "pass", record["problems"]
    assert file_gets(hub, repo) == [(SHARD, None)] * 2
