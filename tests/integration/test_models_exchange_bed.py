"""The striped download on the test bed: one copy through the hub, the rest from peers over the bed's network.

Real sshd hosts, the local hub, a real Prefect server. Faults are real: a peer's agent killed with SIGKILL
while it sends, a peer's disk holding a flipped byte it vouches for, the nodes' timeout killing every agent.
A peer is made slow to send, so a kill lands mid-transfer, with `tc` on its own interface (its egress only,
one htb class per receiving peer).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from k3deploy.core.errors import K3DeployError, ModelsStageFailed
from k3deploy.localhub import publish
from k3deploy.tasks.models import steps
from k3deploy.tasks.models.exchange import stripe_plan
from k3deploy.tasks.models.listing import Listing, RemoteFile
from k3deploy.tasks.node.node_agent import MANIFEST_NAME, PARTIAL_DIR
from k3deploy.tasks.node.node_exchange import FANOUT, PIDFILE, PROBE_BYTES
from k3deploy.tasks.transport import SSHTransport
from tests.bedconfig import bed_config, bed_transports, write_config
from tests.checkpoints import SHARD, checkpoint_files
from tests.modelsbed import file_gets, hub_fixture, node_sha256, poll, run_models, sh, shape_per_peer

pytestmark = [pytest.mark.models, pytest.mark.testbed, pytest.mark.prefect]
TEST_CHECKPOINTS = ("xstripe", "xkilled", "xcorrupt", "xresume", "xslow", "xspread", "xhubfail")
PORT = 18090  # models.exchange_port's default


hub = hub_fixture()


@pytest.fixture
def nodes(testbed) -> Iterator[dict[str, SSHTransport]]:
    """SSH to the four hosts; this module's checkpoints and any shaping of a host's interface gone after."""
    ts = bed_transports(testbed)
    clean = f"rm -rf {' '.join(f'/srv/models/{name}' for name in TEST_CHECKPOINTS)}"
    for t in ts.values():
        sh(t, clean)
    yield ts
    for t in ts.values():
        sh(t, f"{clean}; tc qdisc del dev eth0 root 2>/dev/null; true")
        t.close()


@pytest.fixture
def tokens(monkeypatch) -> list[str]:
    """The exchange tokens the runs made (the real generator, watched)."""
    made: list[str] = []
    real = steps.new_token

    def watched() -> str:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(steps, "new_token", watched)
    return made


def listening(transport: SSHTransport) -> str:
    """Whatever listens on the exchange port on this node (empty: nothing)."""
    return sh(transport, f"ss -ltnH 'sport = :{PORT}'").strip()


def nothing_of_the_exchange_left(nodes: dict[str, SSHTransport], root: str) -> None:
    for name, t in nodes.items():
        assert listening(t) == "", f"{name} still listens on {PORT}"
        assert sh(t, f"test -e {root}/{PIDFILE} && echo left || echo gone").strip() == "gone", name
        # A killed agent's process may still be on its way out when the stage reports: gone within a bound.
        agents = lambda t=t: sh(t, "pgrep -f '[k]3deploy_node_agent' || true").strip() == ""  # noqa: E731
        try:
            poll(f"no agent left on {name}", agents, deadline_s=30)
        except AssertionError:
            left = sh(t, "ps -o pid,ppid,stat,etime,args -p $(pgrep -d, -f '[k]3deploy_node_agent') || true")
            raise AssertionError(f"an agent still runs on {name} 30 s after the stage ended: {left}") from None


def holder_of_largest(files: dict[str, bytes], nodes: list[str]) -> str:
    """The node whose stripe holds the largest file, by the plan the stage makes (unit-tested apart)."""
    listing = Listing("x/y", "c" * 40, tuple(RemoteFile(p, len(b), None, None) for p, b in files.items()))
    plan = stripe_plan(listing, dict.fromkeys(nodes, tuple(files)))
    return next(n for n, part in plan.items() if max(files, key=lambda p: len(files[p])) in part.download)


def hub_bytes(record: dict, node: str) -> tuple[int, int]:
    row = next(r for r in record["checkpoints"][0]["nodes"] if r["node"] == node)
    return row["from hub bytes"], row["from peers bytes"]


def test_each_file_crosses_the_uplink_once_and_every_node_ends_verified_with_nothing_left_serving(
    prefect_server, testbed, hub, nodes, tmp_path, tokens
):
    repo, root = "k3test/xstripe", "/srv/models/xstripe"
    files = checkpoint_files(11)
    commit = publish(hub.root, repo, files)
    hub.clear_requests()

    record = run_models(tmp_path, testbed, hub, repo)

    assert record["verdict"] == "pass", record["problems"]
    assert sorted(file_gets(hub, repo)) == sorted((name, None) for name in files)  # each file once, whole
    total = sum(map(len, files.values()))
    split = {n: hub_bytes(record, n) for n in nodes}
    assert sum(h for h, _ in split.values()) == total  # one copy through the uplink ...
    assert all(h + p == total for h, p in split.values())  # ... and every node received all of it once
    assert all(p > 0 for _, p in split.values())
    for name, t in nodes.items():
        assert node_sha256(t, f"{root}/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest(), name
        manifest = json.loads(sh(t, f"cat {root}/{MANIFEST_NAME}"))
        assert manifest["commit"] == commit and set(manifest["files"]) == set(files)
    nothing_of_the_exchange_left(nodes, root)
    (token,) = tokens
    for name, t in nodes.items():  # the token is nowhere on the nodes either
        assert sh(t, f"grep -rl -- {token} {root} /tmp 2>/dev/null || true").strip() == "", name
    assert token not in json.dumps(record)


@pytest.mark.faults
def test_a_peer_killed_mid_transfer_is_named_and_its_file_comes_through_the_hub_once_more_from_where_it_stopped(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """The holder is killed while it sends the shard to FANOUT receivers: they name it; the shard's first
    rescuer fetches the rest from the hub (from its partial, if it has one), the others take it from that node,
    each from where its own partial stops. The holder's slowness is not judged here (exchange_slow_fraction 0):
    its 2 Mbit/s only makes the kill land mid-file."""
    repo, root = "k3test/xkilled", "/srv/models/xkilled"
    files = checkpoint_files(12)
    publish(hub.root, repo, files)
    holder = holder_of_largest(files, list(nodes))
    receivers = [n for n in nodes if n != holder]
    # The holder sends to each peer at 2 Mbit/s: each takes about 12 s over the shard, so a kill lands mid-file.
    shape_per_peer(nodes[holder], [testbed.host(n).ip for n in receivers], "2mbit")
    partial = f"{root}/{PARTIAL_DIR}/{SHARD}.part"

    def sizes() -> dict[str, int]:
        return {n: int(sh(nodes[n], f"stat -c %s {partial} 2>/dev/null || echo 0").strip()) for n in receivers}

    def receiving() -> bool:
        """FANOUT peers have part of the shard and a quarter of it still to come (seconds, at its rate), so none
        can finish it between this look and the kill; the others wait for a free holder."""
        return sum(0 < s < len(files[SHARD]) * 3 // 4 for s in sizes().values()) == FANOUT

    def kill_when_receiving() -> dict[str, int]:
        poll(f"{FANOUT} nodes receiving {SHARD} from {holder}", receiving, deadline_s=120)
        sh(nodes[holder], f"kill -9 $(cat {root}/{PIDFILE})")
        return sizes()

    hub.clear_requests()
    with ThreadPoolExecutor(1) as pool:
        killer = pool.submit(kill_when_receiving)
        with pytest.raises(K3DeployError) as failed:
            run_models(tmp_path, testbed, hub, repo, models__exchange_slow_fraction=0)
        at_kill = killer.result()
    message = str(failed.value)
    assert f"failed on 1 node(s):\n  {holder}:" in message  # the killed node is the one that failed
    cut = [n for n, size in at_kill.items() if size]
    for n in cut:  # each receiver it was sending to named it
        assert f"what {n} met: {SHARD}: {holder} went away mid-file" in message, message
    (rescuer,) = [n for n in receivers if f"what {n} met: {SHARD}: from the hub, {holder} went away" in message]
    resumed = [r for f, r in file_gets(hub, repo) if f == SHARD]
    assert resumed[0] is None and len(resumed) == 2, resumed  # the holder's own download, then the rescuer's rest
    # each from where its partial stopped (bytes already on their way at the kill still landed)
    rest = re.search(
        rf"what {rescuer} met: {SHARD}: from the hub, {holder} went away mid-file, from byte (\d+)", message
    )
    start = int(rest.group(1)) if rest else 0
    assert resumed[1] == (f"bytes={start}-" if start else None) and start >= at_kill[rescuer]
    for n in receivers:
        if n != rescuer and at_kill[n]:  # cut mid-file: the rest from the rescuer
            took = re.search(rf"what {n} met: {SHARD}: the rest from {rescuer}, from byte (\d+)", message)
            assert took and int(took.group(1)) >= at_kill[n], message
        assert node_sha256(nodes[n], f"{root}/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest(), n
    nothing_of_the_exchange_left(nodes, root)


@pytest.mark.faults
def test_a_peer_serving_bad_bytes_is_refused_and_named_and_the_file_fetched_again(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """node0's shard has a flipped byte with size and mtime kept, so its manifest still vouches for it: the quick
    check passes node0 and it serves the shard to the three nodes that lack it. They refuse every such byte."""
    repo, root = "k3test/xcorrupt", "/srv/models/xcorrupt"
    files = checkpoint_files(13)
    publish(hub.root, repo, files)
    assert run_models(tmp_path, testbed, hub, repo, hosts=1)["verdict"] == "pass"  # node0 alone holds it
    victim, want = f"{root}/{SHARD}", hashlib.sha256(files[SHARD]).hexdigest()
    flip = f"cp -p {victim} /tmp/ref && printf 'X' | dd of={victim} bs=1 seek=1000 conv=notrunc status=none"
    sh(nodes["node0"], f"{flip} && touch -r /tmp/ref {victim} && rm /tmp/ref")

    hub.clear_requests()
    with pytest.raises(ModelsStageFailed) as failed:
        run_models(tmp_path, testbed, hub, repo)
    message = str(failed.value)
    assert "run the models stage with --full-verify" in message
    # Fetched again through the hub once, by one receiver; the others took it from that node.
    assert file_gets(hub, repo) == [(SHARD, None)]
    record = failed.value.result.data
    events = " ".join(record["checkpoints"][0]["exchange_events"])
    refused = [n for n in ("node1", "node2", "node3") if f"{n}: {SHARD}: refused the bytes node0 served" in events]
    assert refused, events
    for n in refused:  # node0 named for every node it served them to
        assert f"node0: served {SHARD} to {n} with bytes that fail the hub's sha256, though its manifest vouches" in (
            message
        )
    rescued = [n for n in ("node1", "node2", "node3") if f"{n}: {SHARD}: from the hub, node0 served bytes" in events]
    assert len(rescued) == 1, events
    for n in ("node1", "node2", "node3"):
        assert node_sha256(nodes[n], victim) == want
    nothing_of_the_exchange_left(nodes, root)

    hub.clear_requests()  # the full verify finds node0's copy bad; it comes from a peer, not the hub
    repaired = run_models(tmp_path, testbed, hub, repo, full_verify=True)
    assert repaired["verdict"] == "pass", repaired["problems"]
    assert file_gets(hub, repo) == []
    assert hub_bytes(repaired, "node0") == (0, len(files[SHARD]))
    assert node_sha256(nodes["node0"], victim) == want


@pytest.mark.faults
def test_an_interrupted_striped_download_resumes_without_fetching_a_byte_twice(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """The shard's hub transfer stalls at 1 MiB until every node holds every other file; then every node's agent
    is killed (SIGKILL, as a crash would): the rerun fetches only what is missing, from where it stopped."""
    repo, root, at = "k3test/xresume", "/srv/models/xresume", 1 << 20
    files = checkpoint_files(14)
    publish(hub.root, repo, files)
    holder = holder_of_largest(files, list(nodes))
    others = set(files) - {SHARD}
    partial = f"{root}/{PARTIAL_DIR}/{SHARD}.part"

    def stalled_with_the_rest_everywhere() -> bool:
        if sh(nodes[holder], f"stat -c %s {partial} 2>/dev/null || echo 0").strip() != str(at):
            return False
        manifests = [sh(t, f"cat {root}/{MANIFEST_NAME} 2>/dev/null || echo '{{}}'") for t in nodes.values()]
        return all(set(json.loads(m).get("files", {})) == others for m in manifests)

    def interrupt() -> None:
        try:
            poll("the shard stalled at 1 MiB and every other file on every node", stalled_with_the_rest_everywhere)
            for t in nodes.values():
                sh(t, f"kill -9 $(cat {root}/{PIDFILE})")
        finally:
            hub.faults.clear()

    hub.faults.stall(repo, SHARD, at=at, times=None)
    with ThreadPoolExecutor(1) as pool:
        interrupted = pool.submit(interrupt)
        with pytest.raises(K3DeployError, match="failed on 4 node"):
            run_models(tmp_path, testbed, hub, repo)
        interrupted.result()
    nothing_of_the_exchange_left(nodes, root)  # in a failure too
    # what each node kept of the shard: the holder its 1 MiB from the hub; a receiver none, or part of the same
    # stalled 1 MiB when the hub rescue (the holder's stream silent for exchange_stall_s) began before the kill
    kept = {n: int(sh(t, f"stat -c %s {partial} 2>/dev/null || echo 0")) for n, t in nodes.items()}
    assert kept.pop(holder) == at
    assert all(0 <= size <= at for size in kept.values()), kept

    hub.clear_requests()
    record = run_models(tmp_path, testbed, hub, repo)
    assert record["verdict"] == "pass", record["problems"]
    assert file_gets(hub, repo) == [(SHARD, f"bytes={at}-")]  # only the rest of the one unfinished file
    split = {n: hub_bytes(record, n) for n in nodes}
    assert split.pop(holder) == (len(files[SHARD]) - at, 0)  # received this run: exactly what was missing
    assert split == {n: (0, len(files[SHARD]) - size) for n, size in kept.items()}  # each from where it stopped
    for name, t in nodes.items():
        assert node_sha256(t, f"{root}/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest(), name
    nothing_of_the_exchange_left(nodes, root)


def test_a_node_whose_exchange_port_is_taken_makes_every_node_download_for_itself(
    prefect_server, testbed, hub, nodes, tmp_path, tokens
):
    """Something else listens on node2's exchange port: no peer is sent the run's token there; per-node instead."""
    repo = "k3test/xstripe"
    files = checkpoint_files(15)
    publish(hub.root, repo, files)
    listen = (  # SO_REUSEADDR: the earlier tests' exchange connections may still be in TIME_WAIT
        "import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('0.0.0.0', {PORT})); s.listen(); time.sleep(600)"
    )
    squatter = f"python3 -c {shlex.quote(listen)}"
    sh(nodes["node2"], f"nohup {squatter} >/dev/null 2>&1 & echo $! > /tmp/squatter.pid")
    try:
        poll("node2's port taken", lambda: listening(nodes["node2"]) != "")
        hub.clear_requests()
        record = run_models(tmp_path, testbed, hub, repo)
    finally:
        sh(nodes["node2"], "kill $(cat /tmp/squatter.pid); rm -f /tmp/squatter.pid")
    assert record["verdict"] == "pass", record["problems"]
    assert tokens == []  # no exchange, so no token made or sent
    assert sorted(file_gets(hub, repo)) == sorted((name, None) for name in files for _ in nodes)
    assert {hub_bytes(record, n) for n in nodes} == {(sum(map(len, files.values())), 0)}


@pytest.mark.faults
def test_a_controller_killed_mid_exchange_leaves_nothing_serving_on_the_nodes(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """SIGKILL to the process running the stage (no hook runs): the agents notice their SSH channel is gone and
    end, their servers with them; nothing listens, nothing downloads for nobody."""
    from prefect.settings import PREFECT_API_URL

    repo, root = "k3test/xkilled", "/srv/models/xkilled"
    files = checkpoint_files(16)
    publish(hub.root, repo, files)
    data = bed_config(testbed, models__hub="huggingface", models__hub_endpoint=hub.url, models__target={"repo": repo})
    config = write_config(tmp_path / "site.yaml", data)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "K3DEPLOY_RUNS_DIR": str(tmp_path / "runs")}
    code = f"from k3deploy.flows.models import models; models(config={config!r})"
    hub.faults.stall(repo, SHARD, at=1 << 20, times=None)  # the exchange stays busy until the fault is cleared
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=Path(__file__).parents[2])
    try:
        poll(
            "every node's exchange agent running",
            lambda: proc.poll() is None and all(listening(t) != "" for t in nodes.values()),
            deadline_s=120,
        )
        proc.kill()
        assert proc.wait(timeout=60) != 0
        poll("every node's exchange gone", lambda: all(listening(t) == "" for t in nodes.values()), deadline_s=60)
    finally:
        hub.faults.clear()
        if proc.poll() is None:
            proc.kill()
    nothing_of_the_exchange_left(nodes, root)


def peer_bytes(record: dict, node: str) -> dict[str, int]:
    return next(r for r in record["checkpoints"][0]["nodes"] if r["node"] == node)["from each peer bytes"]


@pytest.mark.faults
def test_a_slow_holder_is_left_mid_file_named_with_its_rate_and_its_file_spreads_from_one_hub_rescue(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """The issue's case: a small checkpoint with one 48 MiB shard; its holder sends at 8 Mbit/s (1 MB/s) to each peer.
    Its receivers leave it once they see it slower than half of what the hub gives, naming its rate; the shard
    comes through the hub once more, by one node, from where that node's partial stops, and the others take it
    from that node. Every byte is hashed against the hub's sha256. (Its time against the healthy stripe's:
    benchmarks/checkpoint_spread.py, docs/BENCHMARKS.md.)"""
    repo, root = "k3test/xslow", "/srv/models/xslow"
    files = checkpoint_files(17, shard_bytes=48 << 20)
    publish(hub.root, repo, files)
    holder = holder_of_largest(files, list(nodes))
    receivers = [n for n in nodes if n != holder]
    shape_per_peer(nodes[holder], [testbed.host(n).ip for n in receivers], "8mbit")
    hub.clear_requests()
    record = run_models(tmp_path, testbed, hub, repo)

    assert record["verdict"] == "pass", record["problems"]
    events = "\n".join(record["checkpoints"][0]["exchange_events"])
    slow = re.findall(rf"^(\w+): {SHARD}: {holder} sent ([\d.]+) MB/s, under 0.5 × the ([\d.]+) MB/s of "
                      r"(?:the hub|the other peers); left at byte (\d+)", events, re.M)  # fmt: skip
    assert slow, events
    for _, rate, hub_rate, _ in slow:
        assert float(rate) < 0.5 * float(hub_rate) and float(rate) <= 1.2  # 8 Mbit/s, as shaped
    (rescuer,) = [n for n in receivers if f"{n}: {SHARD}: from the hub, every holder is slow ({holder})" in events]
    gets = [r for f, r in file_gets(hub, repo) if f == SHARD]
    probes = [r for r in gets if r == f"bytes=0-{PROBE_BYTES - 1}"]  # what the hub gives, asked once a node
    downloads = [r for r in gets if r != f"bytes=0-{PROBE_BYTES - 1}"]
    assert len(probes) <= len(receivers) and downloads[0] is None and len(downloads) == 2, gets
    assert downloads[1] is None or downloads[1].startswith("bytes=")  # the rescuer's rest, from its partial
    for n in receivers:
        if n != rescuer:  # what the slow holder had not sent came from the rescuer
            assert peer_bytes(record, n).get(rescuer, 0) > 0, peer_bytes(record, n)
    for name, t in nodes.items():
        assert node_sha256(t, f"{root}/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest(), name
    nothing_of_the_exchange_left(nodes, root)


def test_a_file_spreads_from_every_node_that_verified_it_not_only_from_its_hub_downloader(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """A holder sends a file to FANOUT peers at once: the third receiver takes the shard from a node that got it
    from a peer, so the peer bytes received show more than one source for the largest file."""
    repo, root = "k3test/xspread", "/srv/models/xspread"
    files = checkpoint_files(18)
    publish(hub.root, repo, files)
    holder = holder_of_largest(files, list(nodes))
    receivers = [n for n in nodes if n != holder]
    hub.clear_requests()
    record = run_models(tmp_path, testbed, hub, repo)

    assert record["verdict"] == "pass", record["problems"]
    assert sorted(file_gets(hub, repo)) == sorted((name, None) for name in files)  # still one copy through the hub
    shard = len(files[SHARD])  # every other file is far smaller: a source that sent this much sent the shard
    sources = {m for n in receivers for m, sent in peer_bytes(record, n).items() if sent >= shard}
    assert holder in sources and len(sources) > 1, {n: peer_bytes(record, n) for n in receivers}
    for name, t in nodes.items():
        assert node_sha256(t, f"{root}/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest(), name
    nothing_of_the_exchange_left(nodes, root)


@pytest.mark.faults
def test_a_holder_the_hub_refuses_is_named_and_another_node_fetches_its_file_from_the_hub(
    prefect_server, testbed, hub, nodes, tmp_path
):
    """The hub refuses the shard's holder (HTTP 403, once): the shard's first rescuer fetches it from the hub and
    every other node, the holder too, takes it from there; the stage passes."""
    repo, root = "k3test/xhubfail", "/srv/models/xhubfail"
    files = checkpoint_files(19)
    publish(hub.root, repo, files)
    holder = holder_of_largest(files, list(nodes))
    receivers = [n for n in nodes if n != holder]
    hub.clear_requests()
    hub.faults.fail(repo, SHARD, status=403, times=1)
    try:
        record = run_models(tmp_path, testbed, hub, repo)
    finally:
        hub.faults.clear()

    assert record["verdict"] == "pass", record["problems"]
    events = "\n".join(record["checkpoints"][0]["exchange_events"])
    assert f"{holder}: {SHARD}: could not get it from the hub (" in events and "HTTP 403" in events, events
    said = f": {SHARD}: from the hub, {holder} could not get it from the hub ("
    assert len([n for n in receivers if f"{n}{said}" in events]) == 1, events  # one rescuer, named with the holder
    assert [r for f, r in file_gets(hub, repo) if f == SHARD] == [None, None]  # refused once, then the rescuer's
    # the holder took it from a peer: the rescuer, or a node that had it from the rescuer
    assert sum(peer_bytes(record, holder).values()) >= len(files[SHARD]), peer_bytes(record, holder)
    for name, t in nodes.items():
        assert node_sha256(t, f"{root}/{SHARD}") == hashlib.sha256(files[SHARD]).hexdigest(), name
    nothing_of_the_exchange_left(nodes, root)
