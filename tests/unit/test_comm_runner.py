"""The runner on recorded batch outputs, and end to end on in-process simulated nodes (no bed, no SSH)."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from k3deploy.blocks.cluster import ClusterConfig, NodeSpec
from k3deploy.blocks.serve import ServeConfig
from k3deploy.core.errors import CommandTimeout, ConnectionFault
from k3deploy.tasks.batch import parse_output
from k3deploy.tasks.comm import runner
from k3deploy.tasks.comm.runner import cross_node, interpret_phase1, not_applicable, phase1_sections, run_comm_checks
from k3deploy.tasks.node_facts import ToolPaths
from k3deploy.tasks.transport import CommandResult
from testbed import layout
from testbed.npusim import formats
from testbed.npusim.cli import Context, run_hccn_tool, run_npu_smi
from testbed.npusim.model import Faults

pytestmark = pytest.mark.comm
DATA = Path(__file__).parents[1] / "data" / "comm"
TOKEN = "recorded0001"
PORTS = {"service_port": 8000, "rpc_port": 13345}
BED = layout.bed_map(4, Path("/nonexistent"))
PINGS = ("ping", "hccs_ping")
NPU_CHECKS = (
    "npu_smi",
    "lldp",
    "link",
    "speed",
    "net_health",
    "netdetect",
    "gateway",
    "ip",
    "tls",
    "vnic",
    "spod_info",
)


def node(i: int, nic: str = "eth0") -> NodeSpec:
    return NodeSpec(name=f"node{i}", address=f"10.213.0.{10 + i}", nic=nic)


def recorded(name: str, ports: dict[str, int] | None = None):
    sections = phase1_sections(16, ToolPaths(), ports)
    return parse_output(sections, (DATA / name).read_text(), TOKEN)


def failed(rows) -> set[tuple]:
    return {(r.node, r.npu, r.check) for r in rows if not r.ok}


# -- recorded phase-1 batches ------------------------------------------------------------------------


def test_healthy_recorded_node_passes_and_yields_its_addresses():
    facts = interpret_phase1(node(1), recorded("healthy/phase1_node1.txt"), 16)
    assert failed(facts.rows) == set()
    assert len(facts.rows) == 16 * 12 + 4  # 11 NPU checks + hccn_conf per NPU; nic, local_ip, driver, firmware
    assert facts.nic_ips[3] == "10.213.67.11" and facts.vnic_ips[15] == "10.213.111.11"
    assert set(facts.tls.values()) == {"0"} and set(facts.super_pod.values()) == {"0"}
    assert (facts.driver, facts.firmware) == ("24.1.rc3.7", "7.5.0.5.220")


def test_node0_checks_its_ports():
    facts = interpret_phase1(node(0), recorded("healthy/phase1_node0.txt", PORTS), 16, PORTS)
    ports = {r.check: r.detail for r in facts.rows if r.check in PORTS}
    assert ports == {"service_port": "port 8000 is free", "rpc_port": "port 13345 is free"}
    assert failed(facts.rows) == set()


def test_faulty_recorded_node_fails_naming_each_npu_and_check():
    facts = interpret_phase1(node(1), recorded("faulty/phase1_node1.txt"), 16)
    missing = {("node1", 15, c) for c in NPU_CHECKS}
    assert failed(facts.rows) == {("node1", 9, "npu_smi"), ("node1", 3, "link"), ("node1", 5, "net_health")} | missing
    assert 15 not in facts.nic_ips and facts.tls[7] == "1"


def test_tls_odd_npu_fails_only_once_compared_with_the_other_nodes():
    names = {0: "healthy", 1: "faulty", 2: "healthy", 3: "healthy"}
    facts = {
        f"node{i}": interpret_phase1(node(i), recorded(f"{kind}/phase1_node1.txt"), 16) for i, kind in names.items()
    }
    tls = {r.npu: r.detail for r in cross_node(facts) if r.check == "tls" and not r.ok}
    assert tls == {
        7: "tls switch 1 on node1 NPU 7, but 0 on node0, node1, node2, node3",
        15: "exited 255: Error: device 15 does not exist, the logic id is invalid. (ret=-8001)",
    }


def test_a_section_the_batch_never_printed_fails_as_cut_short():
    outputs = recorded("healthy/phase1_node1.txt")
    del outputs["link:4"], outputs["addrs"]
    facts = interpret_phase1(node(1), outputs, 16)
    assert failed(facts.rows) == {("node1", 4, "link"), ("node1", None, "local_ip")}
    assert all("cut short" in r.detail for r in facts.rows if not r.ok)
    assert len(facts.rows) == 16 * 12 + 4  # every check still has its row
    node0 = recorded("healthy/phase1_node0.txt", PORTS)
    del node0["ports"]
    assert failed(interpret_phase1(node(0), node0, 16, PORTS).rows) == {("node0", None, p) for p in PORTS}


# -- whole runs on simulated nodes -------------------------------------------------------------------


class SimNode:
    """A Transport whose node answers batch scripts from the npusim functions, in process."""

    def __init__(self, name: str, faults: dict[str, Faults], error: Exception | None = None) -> None:
        self.host, self.faults, self.error, self.scripts = name, faults, error, 0
        self.calls: list[list[str]] = []  # every tool call the node was asked to make
        self.fail_after: int | None = None  # scripts answered before the node drops off
        entry = BED.host(name)
        self.ctx = Context(BED, entry, faults.get(name, Faults()), lambda h: faults.get(h.name, Faults()))

    def answer(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(argv)
        tool = os.path.basename(argv[0])
        if tool in ("npu-smi", "hccn_tool"):
            res = (run_npu_smi if tool == "npu-smi" else run_hccn_tool)(self.ctx, argv[1:])
            return res.rc, res.out + res.err
        ip = self.ctx.host.ip
        canned = {
            "cat /etc/hccn.conf": formats.hccn_conf(self.ctx.host),
            "cat /usr/local/Ascend/driver/version.info": f"Version={BED.driver_version}\n",
            "ip -o link show": "1: lo: <LOOPBACK,UP> mtu 65536\n2: eth0@if9: <BROADCAST,UP> mtu 1500\n",
            "ip -o addr show": f"1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet {ip}/24 scope global eth0\n",
            "ss -Hltn": f"LISTEN 0      128    {ip}:22 0.0.0.0:*\n",
        }
        return 0, canned[shlex.join(argv)]

    def run(self, command, timeout, on_output=None, stdin=None) -> CommandResult:
        if self.error is not None:
            raise self.error
        if self.fail_after is not None and self.scripts >= self.fail_after:
            raise ConnectionFault(self.host, "connection lost")
        self.scripts += 1
        token = re.search(r"^T=(\w+)$", command, re.M)[1]
        programs = {var: shlex.split(value)[0] for var, value in re.findall(r"^(p\d+)=(.*)$", command, re.M)}
        out = []
        for idx, var, rest in re.findall(r'^r (\d+) "\$(p\d+)"(.*) &$', command, re.M):
            rc, text = self.answer([programs[var], *shlex.split(rest)])
            out.append(f"{token} BEGIN {idx}\n{text}\n{token} END {idx} {rc}\n")
        return CommandResult(self.host, command, 0, "".join(out), "", 0.01)

    def close(self) -> None: ...


def cluster(*nodes: NodeSpec, npus: int = 16) -> ClusterConfig:
    return ClusterConfig(nodes=list(nodes or [node(i) for i in range(4)]), npus_per_node=npus, model_root="/srv/models")


def sim(faults: dict[str, dict] | None = None, **errors: Exception) -> dict[str, SimNode]:
    parsed = {name: Faults.parse(json.dumps(f)) for name, f in (faults or {}).items()}
    return {f"node{i}": SimNode(f"node{i}", parsed, errors.get(f"node{i}")) for i in range(4)}


def test_healthy_cluster_passes_with_one_script_per_node_per_phase():
    nodes = sim()
    report = run_comm_checks(nodes, cluster(), ServeConfig(), 60)
    assert report.ok and report.failures == ()
    assert len(report.rows) == 4 * (16 * 12 + 4) + 2 + 6 * 16 * 2  # + node 0 ports + both pings of 6 pairs
    assert [t.scripts for t in nodes.values()] == [2, 2, 2, 2]
    assert report.summary() == f"comm OK: {len(report.rows)} checks on 4 nodes, 0 failed"
    assert set(report.phase_seconds) == {"local", "pings"}
    assert report.not_applicable == ()


def test_link_down_fails_the_link_and_every_ping_through_it():
    report = run_comm_checks(sim({"node1": {"link_down": [3]}}), cluster(), ServeConfig(), 60)
    pings = [r for r in report.failures if r.check in PINGS]
    assert failed(report.failures) == {("node1", 3, "link")} | {(r.node, 3, r.check) for r in pings}
    with_node1 = sorted((r.check, *sorted((r.node, r.peer))) for r in pings)
    assert with_node1 == sorted((c, *sorted(("node1", p))) for p in ("node0", "node2", "node3") for c in PINGS)


def test_unreachable_node_is_one_row_and_the_others_are_still_checked():
    nodes = sim(node3=ConnectionFault("node3", "cannot reach 10.213.0.13:22 within 2s"))
    report = run_comm_checks(nodes, cluster(), ServeConfig(), 60)
    assert [(r.node, r.npu, r.check, r.detail) for r in report.failures] == [
        ("node3", None, "reach", "node3: cannot reach 10.213.0.13:22 within 2s")
    ]
    assert not [r for r in report.rows if r.peer == "node3"]  # nothing to ping there
    assert sum(r.check == "ping" for r in report.rows) == 3 * 16  # the 3 pairs of the live nodes


def test_timeout_and_empty_script_output_are_batch_rows():
    nodes = sim(node2=CommandTimeout("node2", "killed on the node after 60s"))
    nodes["node1"].run = lambda *a, **k: CommandResult("node1", "", 97, "", "k3comm: mktemp failed\n", 0.0)
    report = run_comm_checks(nodes, cluster(), ServeConfig(), 60)
    assert failed(report.failures) == {("node1", None, "batch"), ("node2", None, "batch")}
    assert "mktemp failed" in next(r.detail for r in report.failures if r.node == "node1")


def test_port_taken_and_nic_missing():
    report = run_comm_checks(sim(), cluster(node(0), node(1, nic="ens9")), ServeConfig(service_port=22), 60)
    assert failed(report.failures) == {
        ("node0", None, "service_port"),
        ("node1", None, "nic"),
        ("node1", None, "local_ip"),
    }
    assert report.summary().startswith("comm FAILED: 3 of ")


def test_table_rows_are_strings_in_fixed_columns():
    report = run_comm_checks(sim({"node2": {"missing_npus": [15]}}), cluster(), ServeConfig(), 60, hccs_ping=False)
    table = report.table_rows(failures_only=True)
    assert {tuple(r) for r in table} == {("node", "npu", "check", "peer", "verdict", "detail")}
    assert {(r["node"], r["npu"], r["check"]) for r in table} == {("node2", "15", c) for c in NPU_CHECKS}
    assert len(report.table_rows()) == len(report.rows)


def test_long_plans_run_as_several_scripts_in_turn(monkeypatch):
    monkeypatch.setattr(runner, "MAX_SECTIONS", 40)
    nodes = sim()
    nodes["node0"].fail_after = 6  # phase 1 takes 5 scripts (167 sections), phase 2 2 (64 pings)
    report = run_comm_checks(nodes, cluster(), ServeConfig(), 60)
    assert [t.scripts for t in nodes.values()] == [6, 7, 6, 6]
    lost = [r for r in report.failures if r.check != "reach"]
    assert {(r.node, r.check) for r in report.failures} == {("node0", "reach"), ("node0", "hccs_ping")}
    assert len(lost) == 64 - 40 and all(r.detail.endswith(": no output") for r in lost)
    assert len(report.rows) == 4 * (16 * 12 + 4) + 2 + 6 * 16 * 2 + 1  # every row still there, + node0's reach


def test_a_node_without_transport_is_a_programming_error():
    with pytest.raises(ValueError, match="node3"):
        run_comm_checks({k: v for k, v in sim().items() if k != "node3"}, cluster(), ServeConfig(), 60)


# -- no NPUs declared (cluster.npus_per_node: 0): host checks only, the NPU groups not applicable --------

NO_NPUS = "cluster.npus_per_node is 0: no NPUs declared"
HOST_ONLY = {"nic", "local_ip", "service_port", "rpc_port"}


def test_without_npus_the_plan_holds_only_the_host_sections():
    assert [s.key for s in phase1_sections(0, ToolPaths(), PORTS)] == ["links", "addrs", "ports"]
    assert [s.key for s in phase1_sections(0, ToolPaths())] == ["links", "addrs"]
    assert len(phase1_sections(1, ToolPaths())) == 1 + 10 + 5  # one NPU: every group again


def test_without_npus_no_npu_tool_is_called_and_every_npu_group_is_not_applicable():
    nodes = sim()
    report = run_comm_checks(nodes, cluster(npus=0), ServeConfig(), 60)
    assert report.ok
    assert [t.scripts for t in nodes.values()] == [1, 1, 1, 1]  # phase 1 only: no ping mesh to run
    called = {name: [shlex.join(argv) for argv in t.calls] for name, t in nodes.items()}
    assert called["node0"] == ["ip -o link show", "ip -o addr show", "ss -Hltn"]
    assert all(calls == ["ip -o link show", "ip -o addr show"] for n, calls in called.items() if n != "node0")
    assert {r.check for r in report.rows} == HOST_ONLY and len(report.rows) == 4 * 2 + 2
    assert [na.group for na in report.not_applicable] == [
        "npu-smi info", "hccn_tool", "spod-info", "hccn.conf", "ping mesh", "driver/firmware",
    ]  # fmt: skip
    assert {na.reason for na in report.not_applicable} == {NO_NPUS}
    covered = {check for na in report.not_applicable for check in na.checks}
    assert covered == set(NPU_CHECKS) | set(PINGS) | {"hccn_conf", "driver_version", "firmware_version"}
    assert report.not_applicable[4].as_dict() == {
        "group": "ping mesh",
        "checks": ["ping", "hccs_ping"],
        "reason": NO_NPUS,
    }
    assert (
        report.summary() == "comm OK: 10 host checks on 4 nodes, 0 failed; NPU checks not applicable (no NPUs declared)"
    )


def test_without_npus_a_host_check_still_fails():
    nodes = sim()
    report = run_comm_checks(nodes, cluster(node(0), node(1, nic="ens9"), npus=0), ServeConfig(service_port=22), 60)
    assert failed(report.failures) == {
        ("node0", None, "service_port"),
        ("node1", None, "nic"),
        ("node1", None, "local_ip"),
    }
    assert report.summary().startswith("comm FAILED: 3 of 6 checks on 2 nodes")
    assert len(report.not_applicable) == 6  # still said, whatever the outcome


def test_without_npus_a_cut_short_batch_fails_only_host_rows():
    facts = interpret_phase1(node(0), {}, 0, PORTS)
    assert failed(facts.rows) == {("node0", None, c) for c in HOST_ONLY}
    assert facts.driver is None and facts.nic_ips == {}


def test_planes_the_site_does_not_run_are_left_out_and_named():
    roce_only = [s.key.partition(":")[0] for s in phase1_sections(2, ToolPaths(), None, ("roce",))]
    assert "vnic" not in roce_only and "spod_info" not in roce_only and "ip" in roce_only
    hccs_only = [s.key.partition(":")[0] for s in phase1_sections(2, ToolPaths(), None, ("hccs",))]
    assert {"vnic", "spod_info", "npu_smi"} <= set(hccs_only) and not {"ip", "link", "hccn_conf"} & set(hccs_only)
    assert [g.group for g in not_applicable(16, ("hccs",))] == ["roce plane"]
    assert not_applicable(16) == () and {g.brief for g in not_applicable(0)} == {"no NPUs declared"}
