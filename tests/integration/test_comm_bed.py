"""The comm checks over real SSH against the bed's simulated A3 nodes, healthy and with injected faults.

Each fault must fail exactly the rows it should: named node, NPU, check (and peer for pings).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from k3deploy.blocks.cluster import ClusterConfig, NodeSpec
from k3deploy.blocks.serve import ServeConfig
from k3deploy.tasks.comm import CommReport, run_comm_checks
from k3deploy.tasks.transport import transports_for

pytestmark = [pytest.mark.comm, pytest.mark.testbed, pytest.mark.faults]
NODES = ("node0", "node1", "node2", "node3")
NPUS = range(16)
LOCAL = (
    "npu_smi",
    "lldp",
    "link",
    "speed",
    "net_health",
    "netdetect",
    "gateway",
    "hccn_conf",
    "ip",
    "tls",
    "vnic",
    "spod_info",
)
PINGS = ("ping", "hccs_ping")
# The bed is shared: other sessions start servers on node0 (host network), so tests that are not about
# ports check two that nothing there binds (privileged, unassigned in practice).
QUIET_PORTS = ServeConfig(service_port=1, rpc_port=2)


def bed_cluster(bed, nics: dict[str, str] | None = None, extra: list[NodeSpec] = (), npus: int = 16) -> ClusterConfig:
    """The bed's first four hosts; host-level tests check only `npus` NPUs per node, to save the bed's CPU."""
    nics = nics or {}
    nodes = [NodeSpec(name=h.name, address=h.ip, nic=nics.get(h.name, "eth0")) for h in bed.hosts[:4]]
    return ClusterConfig(
        nodes=nodes + list(extra),
        model_root="/srv/models",
        npus_per_node=npus,
        ssh={"known_hosts": str(bed.known_hosts), "private_key_file": str(bed.key), "connect_timeout_s": 3},
    )


@pytest.fixture
def comm(testbed) -> Iterator[Callable[..., CommReport]]:
    """Run the checks on the bed's first four hosts (or a given cluster); transports closed after."""
    opened = []

    def run(cluster: ClusterConfig | None = None, serve: ServeConfig | None = None, **kw) -> CommReport:
        cluster = cluster or bed_cluster(testbed)
        transports = transports_for(cluster)
        opened.extend(transports.values())
        return run_comm_checks(transports, cluster, serve or QUIET_PORTS, 120, **kw)

    yield run
    for t in opened:
        t.close()


def failed(report: CommReport) -> set[tuple]:
    return {(r.node, r.npu, r.check, r.peer) for r in report.failures}


def test_healthy_bed_passes_every_check_on_every_npu(comm, testbed):
    report = comm()
    assert report.failures == (), report.summary()
    for name in NODES:
        checks = {(r.npu, r.check) for r in report.rows if r.node == name}
        assert {(i, c) for i in NPUS for c in LOCAL} <= checks
    pairs = Counter((r.check, frozenset((r.node, r.peer))) for r in report.rows if r.check in PINGS)
    assert set(pairs.values()) == {16} and len(pairs) == 2 * 6  # each pair of nodes once per NPU and plane
    ip = next(r for r in report.rows if (r.node, r.npu, r.check) == ("node2", 5, "ip"))
    assert ip.detail == f"ipaddr:{testbed.host('node2').npus[5]['ip']}"
    assert report.summary() == f"comm OK: {len(report.rows)} checks on 4 nodes, 0 failed"


def test_link_down_fails_that_npu_and_every_ping_through_it(comm, testbed_faults):
    testbed_faults.set("node1", {"link_down": [3]})
    report = comm()
    through = {r for r in failed(report) if r[2] in PINGS}
    assert failed(report) == {("node1", 3, "link", None)} | through
    assert sorted((c, *sorted((n, p))) for n, _, c, p in through) == sorted(
        (c, *sorted(("node1", p))) for p in set(NODES) - {"node1"} for c in PINGS
    )  # every pair with node1, once per plane
    link = next(r for r in report.failures if r.check == "link")
    assert link.detail == "link status: DOWN"


def test_tls_mismatch_names_the_odd_node_on_every_npu(comm, testbed_faults):
    testbed_faults.set("node3", {"tls_switch": 1})
    report = comm(hccs_ping=False)
    assert failed(report) == {("node3", i, "tls", None) for i in NPUS}
    assert report.failures[0].detail == "tls switch 1 on node3 NPU 0, but 0 on node0, node1, node2"


def test_ping_loss_between_two_nodes_names_both(comm, testbed_faults):
    testbed_faults.set("node0", {"ping_loss": ["node2"]})
    report = comm()
    assert failed(report) == {("node0", i, c, "node2") for i in NPUS for c in PINGS}
    ping7 = next(r for r in report.failures if (r.npu, r.check) == (7, "ping"))
    assert ping7.detail == "to node2 NPU 7 10.213.71.12: 3 packets transmitted, 0 received, 100.00% packet loss"


def test_missing_npu_fails_its_checks_and_nothing_else(comm, testbed_faults):
    testbed_faults.set("node2", {"missing_npus": [15]})
    report = comm()
    assert failed(report) == {("node2", 15, c, None) for c in LOCAL if c != "hccn_conf"}
    smi = next(r for r in report.failures if r.check == "npu_smi")
    assert smi.detail == "NPU 15 (board 7, die 1) is not listed by npu-smi info"
    assert not [r for r in report.rows if r.npu == 15 and r.check in PINGS and "node2" in (r.node, r.peer)]


def test_configured_nic_missing_on_one_node(comm, testbed):
    report = comm(bed_cluster(testbed, nics={"node1": "enp189s0f0"}, npus=2))
    assert failed(report) == {("node1", None, "nic", None), ("node1", None, "local_ip", None)}
    nic = report.failures[0]
    assert nic.detail.startswith("NIC enp189s0f0 does not exist on node1; interfaces: lo, eth0")
    assert report.failures[1].detail == "enp189s0f0 does not own LOCAL_IP 10.213.0.11; it is on eth0"


def test_node0_port_already_listening(comm, testbed):
    report = comm(bed_cluster(testbed, npus=2), ServeConfig(service_port=1, rpc_port=22))  # sshd listens on 22
    assert failed(report) == {("node0", None, "rpc_port", None)}
    assert re.fullmatch(
        r"port 22 is taken: LISTEN +0 +\d+ +10\.213\.0\.10:22 +0\.0\.0\.0:\*", report.failures[0].detail
    )


def test_unreachable_node_is_a_row_and_hides_no_other_result(comm, testbed):
    ghost = NodeSpec(name="ghost", address="10.213.0.250", nic="eth0")  # on the bridge, nobody answers
    report = comm(bed_cluster(testbed, extra=[ghost], npus=2))
    assert failed(report) == {("ghost", None, "reach", None)}
    assert "cannot reach 10.213.0.250:22" in report.failures[0].detail
    assert sum(r.check == "ping" for r in report.rows) == 6 * 2  # the 6 pairs of live nodes, 2 NPUs each


def test_an_hccn_tool_that_refuses_concurrent_use_is_retried_until_every_check_answers(comm, testbed, testbed_faults):
    """Like the real tool (`hccn_tool is busy, please try again.`), node1's refuses a call while another runs."""
    testbed_faults.set("node1", {"hccn_exclusive_s": 0.02})
    report = comm(bed_cluster(testbed, npus=4), parallel=4)  # node1's four sections still collide
    assert report.failures == (), report.summary()
    checks = {(r.npu, r.check) for r in report.rows if r.node == "node1"}
    assert {(i, c) for i in range(4) for c in LOCAL} <= checks  # every NPU check of node1 answered


def test_an_hccs_only_site_runs_no_roce_check_and_says_so(comm, testbed):
    cluster = bed_cluster(testbed).model_copy(update={"comm_planes": ["hccs"]})
    report = comm(cluster)
    assert report.failures == (), report.summary()
    checks = {r.check for r in report.rows}
    assert {"vnic", "spod_info", "hccs_ping", "npu_smi"} <= checks
    assert not checks & {"lldp", "link", "net_health", "netdetect", "gateway", "ip", "tls", "hccn_conf", "ping"}
    assert [(g.group, g.reason) for g in report.not_applicable] == [("roce plane", "cluster.comm_planes has no roce")]


def test_a_site_without_roce_fails_its_roce_plane_on_every_npu_unless_hccs_only(comm, testbed, testbed_faults):
    """Super-pod sites may run HCCS only (`-ip -g` fails there): checking RoCE fails it, naming each NPU."""
    for name in NODES:
        testbed_faults.set(name, {"no_roce": True})
    report = comm(bed_cluster(testbed, npus=2))
    ip_failures = {(r.node, r.npu) for r in report.failures if r.check == "ip"}
    assert ip_failures == {(n, i) for n in NODES for i in range(2)}
    ip_row = next(r for r in report.failures if r.check == "ip")
    assert "Get ipconf failed, because no ip was preset there!" in ip_row.detail  # the tool's words reach the row
    assert {r.check for r in report.failures} <= {"ip", "netdetect", "gateway", "ping"}
    assert not any(r.check in ("vnic", "hccs_ping", "spod_info") for r in report.failures)
    hccs_only = comm(bed_cluster(testbed, npus=2).model_copy(update={"comm_planes": ["hccs"]}))
    assert hccs_only.failures == (), hccs_only.summary()
