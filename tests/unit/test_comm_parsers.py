"""NPU check parsers: on published real output (tests/data/comm/published, sources in its README) and,
for the orchestration around them, on outputs recorded from the bed's simulators (tests/data/comm, record.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.core.stage import Finding
from k3deploy.tasks.comm import host_checks as hc
from k3deploy.tasks.comm import npu_checks as nc
from k3deploy.tasks.comm.checks import NPU_GROUPS, NPU_TABLE, PARSERS, PLANE_CHECKS

pytestmark = pytest.mark.comm
DATA = Path(__file__).parents[1] / "data" / "comm"
RECORDED = json.loads((DATA / "recorded.json").read_text())


def rec(name: str) -> tuple[str, int]:
    """A recorded output and its exit code."""
    return (DATA / name).read_text(), RECORDED[name]["rc"]


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, findings
    return findings[0]


def test_builders_quote_nothing_themselves_and_name_the_npu():
    tools = nc.ToolPaths(hccn_tool="/opt/my tools/hccn_tool")
    assert nc.hccn_cmd(tools, 7, "link") == ["/opt/my tools/hccn_tool", "-i", "7", "-link", "-g"]
    assert nc.ping_cmd(tools, 2, "10.0.0.9", hccs=True)[3:] == ["-hccs_ping", "-g", "address", "10.0.0.9"]
    with pytest.raises(ValueError):
        nc.ping_cmd(tools, 2, "10.0.0.9; reboot")
    with pytest.raises(ValueError):
        nc.hccn_cmd(tools, 0, "set_ip")


def test_healthy_npu_smi_info_lists_16_healthy_npus():
    rows = nc.parse_npu_smi_info("node1", *rec("healthy/npu_smi_info.txt"), 16)
    assert [(r.npu, r.ok) for r in rows] == [(i, True) for i in range(16)]
    text = rec("healthy/npu_smi_info.txt")[0]
    assert rows[9].detail.startswith("health OK: | 4     Ascend910           | OK ")
    assert rows[9].detail.removeprefix("health OK: ") in text.splitlines()  # the board row, verbatim


def test_missing_and_critical_npus_are_named():
    rows = nc.parse_npu_smi_info("node1", *rec("faulty/npu_smi_info.txt"), 16)
    bad = {r.npu: r.detail for r in rows if not r.ok}
    assert set(bad) == {9, 15}
    assert bad[15] == "NPU 15 (board 7, die 1) is not listed by npu-smi info"
    assert bad[9].startswith("health Critical: | 4     Ascend910           | Critical")


def test_npu_smi_info_that_fails_is_one_node_row():
    row = only(nc.parse_npu_smi_info("node1", "bash: npu-smi: command not found\n", 127, 16))
    assert (row.npu, row.ok) == (None, False) and "command not found" in row.detail


@pytest.mark.parametrize(
    ("query", "detail"),
    [
        ("lldp", "Ifname: 400GE1/2/2:2"),
        ("link", "link status: UP"),
        ("net_health", "net health status: Success"),
        ("netdetect", "netdetect address: 10.213.67.1"),
        ("gateway", "default gateway:10.213.67.1, Iface:eth3"),
        ("ip", "ipaddr:10.213.67.11"),
        ("vnic", "vnic ipaddr: 10.213.99.11"),
    ],
)
def test_healthy_hccn_outputs_pass_showing_the_line_the_guide_reads(query: str, detail: str):
    row = only(PARSERS[query]("node1", 3, *rec(f"healthy/{query}.txt")))
    assert (row.node, row.npu, row.check, row.ok, row.detail) == ("node1", 3, query, True, detail)


def test_values_for_phase_2_and_cross_node_checks():
    assert nc.npu_ip(rec("healthy/ip.txt")[0]) == "10.213.67.11"
    assert nc.vnic_ip(rec("healthy/vnic.txt")[0]) == "10.213.99.11"
    assert nc.tls_switch(rec("healthy/tls.txt")[0]) == "0"
    assert nc.tls_switch(rec("faulty/tls_npu7.txt")[0]) == "1"
    assert nc.npu_ip(rec("faulty/ip_npu15.txt")[0]) is None
    assert nc.spod_fields(rec("healthy/spod_info.txt")[0]) == {
        "SDID": "4390912", "Super Pod Size": "384", "Super Pod ID": "0", "Server Index": "1"
    }  # fmt: skip


def test_link_down_fails_with_its_line():
    row = only(nc.parse_link("node1", 3, *rec("faulty/link_npu3.txt")))
    assert (row.npu, row.ok, row.detail) == (3, False, "link status: DOWN")


def test_net_health_other_than_success_fails():
    row = only(nc.parse_net_health("node1", 5, *rec("faulty/net_health_npu5.txt")))
    assert (row.ok, row.detail) == (False, "net health status: Socket fail")


def test_tls_is_read_here_and_judged_across_nodes():
    row = only(nc.parse_tls("node1", 7, *rec("faulty/tls_npu7.txt")))
    assert row.ok and row.detail.startswith("dev_id:7, tls switch[1](0:disable, 1:enable)")


@pytest.mark.parametrize(("parse", "name"), [(nc.parse_lldp, "lldp"), (nc.parse_ip, "ip")])
def test_a_missing_npu_fails_every_query_with_the_tools_error(parse, name):
    text, rc = rec(f"faulty/{name}_npu15.txt")
    assert rc == 255
    row = only(parse("node1", 15, text, rc))
    assert row.ok is False
    assert row.detail == "exited 255: Error: device 15 does not exist, the logic id is invalid. (ret=-8001)"


def test_spod_info_of_a_missing_die_names_board_and_die():
    row = only(nc.parse_spod_info("node1", 15, *rec("faulty/spod_info_npu15.txt")))
    assert row.ok is False and "NPU ID 7, chip ID 1" in row.detail
    healthy = only(nc.parse_spod_info("node1", 3, *rec("healthy/spod_info.txt")))
    assert healthy.ok and healthy.detail == "SDID 4390912, Super Pod ID 0"


@pytest.mark.parametrize(
    ("text", "rc", "detail"),
    [
        ("lldp neighbours: none\n", 0, "unexpected output: lldp neighbours: none"),
        ("Chassis ID TLV\n\tIfname: \n", 0, "Ifname:"),
        ("", 124, "timed out: (no output)"),
    ],
)
def test_lldp_without_a_neighbour_or_answer_fails(text: str, rc: int, detail: str):
    row = only(nc.parse_lldp("node0", 1, text, rc))
    assert (row.ok, row.detail) == (False, detail)


def test_bad_addresses_fail():
    assert not only(nc.parse_gateway("n", 0, "default gateway:none, Iface:eth0\n")).ok
    assert not only(nc.parse_ip("n", 0, "ipaddr:300.1.2.3\nnetmask:255.255.255.0\n")).ok
    assert not only(nc.parse_vnic("n", 0, "vnic link status: DOWN\nvnic ipaddr: 10.0.0.1\n")).ok


def test_healthy_pings_pass():
    row = only(nc.parse_ping("node1", 3, *rec("healthy/ping_node2.txt"), peer="node2", peer_npu=3,
                             address="10.213.67.12"))  # fmt: skip
    assert (row.check, row.peer, row.ok) == ("ping", "node2", True)
    assert row.detail == "to node2 NPU 3 10.213.67.12: 3 packets transmitted, 3 received, 0.00% packet loss"
    hccs = only(nc.parse_ping("node1", 3, *rec("healthy/hccs_ping_node2.txt"), peer="node2", peer_npu=3,
                              address="10.213.99.12", hccs=True))  # fmt: skip
    assert (hccs.check, hccs.ok) == ("hccs_ping", True)


@pytest.mark.parametrize(
    ("name", "hccs", "summary"),
    [
        ("faulty/ping_npu4_node2.txt", False, "3 packets transmitted, 0 received, 100.00% packet loss"),
        ("faulty/ping_npu4_node3.txt", False, "3 packets transmitted, 2 received, 33.33% packet loss"),
        ("faulty/ping_npu3_node2.txt", False, "3 packets transmitted, 0 received, 100.00% packet loss"),
        ("faulty/hccs_ping_npu4_node3.txt", True, "3 packets transmitted, 2 received, 33.33% packets loss"),
        ("faulty/hccs_ping_npu3_node2.txt", True, "3 packets transmitted, 0 received, 100.00% packets loss"),
    ],
)
def test_any_lost_packet_fails_the_ping(name: str, hccs: bool, summary: str):
    row = only(nc.parse_ping("node1", 4, *rec(name), peer="node3", peer_npu=4, address="10.213.68.13", hccs=hccs))
    assert (row.node, row.npu, row.peer, row.ok) == ("node1", 4, "node3", False)
    assert row.detail.endswith(summary)


def test_ping_without_summary_fails():
    row = only(nc.parse_ping("n", 0, "hccn_tool: usage\n", 2, peer="m", peer_npu=0, address="10.0.0.1"))
    assert row.ok is False and row.detail == "to m NPU 0 10.0.0.1: exited 2: hccn_tool: usage"


def test_a_tool_call_that_never_finished_says_so():
    row = only(nc.parse_link("node0", 2, "", None))
    assert (row.ok, row.detail) == (False, "did not finish: (no output)")
    assert only(nc.parse_npu_smi_info("node0", "", 124, 16)).detail == "npu-smi info timed out: (no output)"


@pytest.mark.parametrize("name", ["hccn_tool-netdetect-addr.txt", "hccn_tool-netdetect-address.txt"])
def test_netdetect_reads_both_published_forms(name):
    """The driver source prints `netdetect addr:`, older releases and guides `netdetect address:` (README beside)."""
    text = (DATA / "published" / name).read_text()
    (finding,) = nc.parse_netdetect("node0", 3, text)
    assert finding.ok and finding.detail.endswith("11.12.165.1")


PUBLISHED = DATA / "published"  # real output from Huawei's guides and source, users' posts (README there)


@pytest.mark.parametrize(
    ("query", "name", "value"),
    [
        ("lldp", "hccn_tool-lldp.txt", "400GE1/1/5:1"),
        ("link", "hccn_tool-link.txt", "UP"),
        ("speed", "hccn_tool-speed.txt", "100000 Mb/s"),
        ("net_health", "hccn_tool-net_health.txt", "Success"),
        ("gateway", "hccn_tool-gateway.txt", "11.12.165.1"),
        ("ip", "hccn_tool-ip.txt", "29.1.112.213"),
        ("tls", "hccn_tool-tls.txt", "tls switch[0]"),
        ("vnic", "hccn_tool-vnic.txt", "192.168.2.199"),
    ],
)
def test_every_hccn_tool_parser_passes_published_healthy_output(query, name, value):
    (finding,) = PARSERS[query]("node0", 0, (PUBLISHED / name).read_text(), 0)
    assert finding.ok and value in finding.detail, finding


def test_a_port_speed_the_driver_cannot_tell_fails_and_known_speeds_must_agree_across_npus():
    (unknown,) = PARSERS["speed"]("node1", 6, (PUBLISHED / "hccn_tool-speed-unknown.txt").read_text(), 0)
    assert not unknown.ok and unknown.detail == "Speed: Unknown!"
    assert nc.link_speed((PUBLISHED / "hccn_tool-speed.txt").read_text()) == "100000"
    speed = next(c for c in NPU_TABLE if c.name == "speed")  # one table entry: plane, group, value compared
    assert (speed.plane, speed.group, speed.compared_as) == ("roce", "hccn_tool", "port speed (Mb/s)")
    assert "speed" in PLANE_CHECKS["roce"] and "speed" in dict(NPU_GROUPS)["hccn_tool"]


def test_a_published_roce_ping_and_spod_info_pass():
    text = (PUBLISHED / "hccn_tool-ping.txt").read_text()
    (ping,) = nc.parse_ping("node0", 0, text, 0, peer="node1", peer_npu=0, address="11.12.165.80")
    assert ping.ok and "3 received, 0.00% packet loss" in ping.detail
    (spod,) = nc.parse_spod_info("node0", 0, (PUBLISHED / "npu-smi-spod-info.txt").read_text(), 0)
    assert spod.ok and spod.detail == "SDID 16777216, Super Pod ID 0"


def test_the_published_hccn_conf_matches_the_published_ip():
    from k3deploy.tasks.comm import host_checks as hc

    rows = hc.parse_hccn_conf("node0", (PUBLISHED / "hccn.conf").read_text(), 0, 1, {0: "29.1.137.205"})
    assert rows and all(r.ok for r in rows), rows


def test_a_published_a3_npu_smi_table_lists_16_healthy_dies():
    """vllm-ascend#960: a whole A3 table, 8 boards × 2 dies with Phy-IDs, all idle."""
    text = (PUBLISHED / "npu-smi-info-a3.txt").read_text()
    rows = nc.parse_npu_smi_info("node0", text, 0, 16)
    assert [(r.npu, r.ok) for r in rows] == [(i, True) for i in range(16)]
    assert rows[15].detail.startswith("health OK: | 7     Ascend910")
    short = nc.parse_npu_smi_info("node0", text.split("| 7     Ascend910")[0], 0, 16)  # the table cut short
    assert [r.npu for r in short if not r.ok] == [14, 15]
    assert "NPU 15 (board 7, die 1) is not listed" in short[-1].detail


def test_a_published_910b3_table_without_phy_ids_and_with_a_process_row():
    """vllm-ascend#6512: one die per board (no Phy-ID column) and a process row that looks like a chip row."""
    text = (PUBLISHED / "npu-smi-info-910b3.txt").read_text()
    rows = nc.parse_npu_smi_info("node0", text, 0, 8, dies_per_board=1)
    assert [(r.npu, r.ok) for r in rows] == [(i, True) for i in range(8)]
    sick = text.replace("| 3     910B3               | OK  ", "| 3     910B3               | Alarm")
    assert [r.npu for r in nc.parse_npu_smi_info("node0", sick, 0, 8, dies_per_board=1) if not r.ok] == [3]


def test_firmware_version_from_a_published_board_query():
    rows, value = hc.parse_version("node0", "firmware_version", (PUBLISHED / "npu-smi-board-910.txt").read_text(), 0)
    assert value == "7.1.0.7.220" and rows[0].ok


def test_ip_on_an_npu_without_a_preset_address_fails_with_the_tools_words():
    """hicann/driver cmd.c's message (stderr), as users saw it on 910B3 hosts; rc unpublished, any non-zero."""
    text = (PUBLISHED / "hccn_tool-ip-not-preset.txt").read_text()
    (row,) = PARSERS["ip"]("node0", 4, text, 1)
    assert not row.ok and "Get ipconf failed, because no ip was preset there!" in row.detail
    assert nc.npu_ip(text) is None
