"""Cross-node comparisons name the odd node; the ping plan covers every pair of nodes once."""

from __future__ import annotations

import pytest

from k3deploy.core.agreement import majority
from k3deploy.tasks.comm.cross import consistent, ping_peers, ping_plan
from k3deploy.tasks.comm.finding import fail, ok

pytestmark = pytest.mark.comm


def test_majority_is_none_on_a_tie():
    assert majority(["0", "0", "1"]) == "0"
    assert majority(["0", "1"]) is None
    assert majority([]) is None


def test_the_odd_node_is_named_and_only_its_rows_fail():
    values = {(f"node{n}", None): "24.1.rc3.7" for n in range(4)} | {("node2", None): "24.1.rc2"}
    rows = [ok(f"node{n}", None, "driver_version", values[(f"node{n}", None)]) for n in range(4)]
    out = consistent(rows, values, "driver")
    assert [r.node for r in out if not r.ok] == ["node2"]
    assert out[2].detail == "driver 24.1.rc2 on node2, but 24.1.rc3.7 on node0, node1, node3"
    assert out[2].check == "driver_version"


def test_per_npu_values_name_node_and_npu():
    values = {(f"node{n}", i): "0" for n in range(4) for i in range(16)} | {("node3", 5): "1"}
    rows = [ok(n, i, "tls", "read") for (n, i) in values]
    bad = [r for r in consistent(rows, values, "tls switch") if not r.ok]
    assert [(r.node, r.npu) for r in bad] == [("node3", 5)]
    assert bad[0].detail.startswith("tls switch 1 on node3 NPU 5, but 0 on node0, node1, node2, node3")


def test_without_a_majority_every_differing_row_fails_and_shows_the_split():
    values = {("node0", None): "a", ("node1", None): "b"}
    out = consistent([ok("node0", None, "firmware_version", "a"), ok("node1", None, "firmware_version", "b")],
                     values, "firmware")  # fmt: skip
    assert [r.ok for r in out] == [False, False]
    assert "no majority across nodes (a on node0; b on node1)" in out[0].detail


def test_rows_already_failed_or_without_value_are_kept():
    failed = fail("node1", 3, "tls", "exited 255: Error")
    out = consistent([failed, ok("node0", 3, "tls", "x")], {("node0", 3): "0"}, "tls switch")
    assert out == [failed, ok("node0", 3, "tls", "x")]


@pytest.mark.parametrize("n", range(1, 10))
def test_ping_peers_cover_every_pair_once_and_share_the_sending(n):
    nodes = [f"node{i}" for i in range(n)]
    sent = {node: ping_peers(node, nodes) for node in nodes}
    pairs = [frozenset((node, peer)) for node, peers in sent.items() for peer in peers]
    assert len(pairs) == len(set(pairs)) == n * (n - 1) // 2
    assert all(node not in peers for node, peers in sent.items())
    assert {len(p) for p in sent.values()} <= {(n - 1) // 2, n // 2}  # nobody sends more than half


def test_ping_plan_pairs_same_numbered_npus_on_the_peers_it_is_given():
    addr = {f"node{n}": {i: f"10.213.{64 + i}.{10 + n}" for i in range(16)} for n in range(4)}
    plan = ping_plan("node1", addr)
    assert list(dict.fromkeys(t.peer for t in plan)) == ["node2", "node3"]
    assert {(t.peer, t.npu, t.peer_npu) for t in plan} == {(p, i, i) for p in ("node2", "node3") for i in range(16)}
    assert plan[0].address == "10.213.64.12" and plan[0].key == "ping:0:node2"
    assert [t.npu for t in plan[:16]] == list(range(16))  # a batch group of 16 uses 16 distinct NPUs
    everyone = {frozenset((node, t.peer)) for node in addr for t in ping_plan(node, addr)}
    assert len(everyone) == 6


def test_npus_without_an_address_are_left_out_on_both_sides():
    addr = {"node0": {i: f"10.0.{i}.10" for i in range(4)}, "node1": {0: "10.0.0.11", 1: "10.0.1.11", 3: "10.0.3.11"}}
    assert [(t.npu, t.peer) for t in ping_plan("node0", addr)] == [(0, "node1"), (1, "node1"), (3, "node1")]
    assert ping_plan("node1", addr) == []  # the pair is node0's to ping
    hccs = ping_plan("node0", addr, hccs=True)
    assert [t.key for t in hccs] == ["hccs_ping:0:node1", "hccs_ping:1:node1", "hccs_ping:3:node1"]
    assert ping_plan("node0", {"node0": addr["node0"]}) == []
    assert ping_plan("node9", addr) == []
