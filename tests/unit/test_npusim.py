"""The NPU tool simulators' output formats and fault logic, called directly (no bed needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from testbed import layout
from testbed.npusim import formats
from testbed.npusim.cli import Context, Result, main, ping_replies, run_hccn_tool, run_npu_smi
from testbed.npusim.model import BedMap, FaultError, Faults

pytestmark = pytest.mark.bed  # the test bed itself

BED = layout.bed_map(4, Path("/nonexistent"))
CHIP_ROW = re.compile(r"^\| (\d+)\s+(\d+)\s+\| 0000:[0-9A-F]{2}:00\.0\s+\|")


def ctx(host: str = "node0", faults: Faults | None = None, peers: dict[str, Faults] | None = None) -> Context:
    peers = peers or {}
    return Context(BED, BED.host(host), faults or Faults(), lambda h: peers.get(h.name, Faults()))


def hccn(*args: str, **kw: object) -> Result:
    return run_hccn_tool(ctx(**kw), list(args))  # type: ignore[arg-type]


def npu_smi(*args: str, **kw: object) -> Result:
    return run_npu_smi(ctx(**kw), list(args))  # type: ignore[arg-type]


def test_npu_smi_info_lists_16_dies_on_8_boards_in_the_a3_layout() -> None:
    out = npu_smi("info").out
    lines = out.splitlines()
    assert all(len(line) == 98 for line in lines), {len(line) for line in lines}
    assert lines[1].startswith("| npu-smi 24.1.rc3.7") and "Version: 24.1.rc3.7" in lines[1]
    assert "| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |" in lines
    rows = [CHIP_ROW.match(line) for line in lines]
    chips = [(int(m[1]), int(m[2])) for m in rows if m]
    assert chips == [(c, phy) for phy in range(16) for c in [phy % 2]]
    assert out.count("| 0     Ascend910           | OK            |") == 2  # board 0: dies 0 and 1
    assert [f"No running processes found in NPU {n}" in out for n in range(8)] == [True] * 8


def test_missing_npu_is_not_listed_and_its_commands_fail() -> None:
    faults = Faults(missing_npus=frozenset({15}))
    out = npu_smi("info", faults=faults).out
    chips = [CHIP_ROW.match(line) for line in out.splitlines()]
    assert sum(1 for m in chips if m) == 15
    assert "No running processes found in NPU 7" in out  # board 7 still has die 14
    gone = hccn("-i", "15", "-link", "-g", faults=faults)
    assert gone.rc != 0 and gone.out == "" and "15" in gone.err
    assert npu_smi("info", "-t", "spod-info", "-i", "7", "-c", "1", faults=faults).rc != 0
    assert npu_smi("info", "-t", "spod-info", "-i", "7", "-c", "0", faults=faults).rc == 0
    both = Faults(missing_npus=frozenset({14, 15}))
    assert "NPU 7" not in npu_smi("info", faults=both).out
    assert "\tTotal Count                    : 7" in npu_smi("info", "-l", faults=both).out


def test_npu_smi_map_has_logic_ids_and_an_mcu_row_per_board() -> None:
    lines = npu_smi("info", "-m").out.splitlines()
    assert lines[0].split() == ["NPU", "ID", "Chip", "ID", "Chip", "Logic", "ID", "Chip", "Phy-ID", "Chip", "Name"]
    rows = [line.split() for line in lines[1:]]
    assert ["7", "1", "15", "15", "Ascend910"] in rows
    assert sum(1 for r in rows if r[-1] == "Mcu") == 8


def test_spod_info_fields_parse_like_the_ranktable_scripts_do() -> None:
    out = npu_smi("info", "-t", "spod-info", "-i", "3", "-c", "1", host="node2").out
    squeezed = out.replace(" ", "")
    sdid = int(re.search(r"\tSDID:(\d+)\n", squeezed)[1])  # type: ignore[index]
    assert re.search(r"\tSuperPodID:(\d)\n", squeezed)[1] == "0"  # type: ignore[index]
    pod_line = next(line for line in out.splitlines() if "Super Pod ID" in line)
    assert pod_line.split()[4] == "0"  # awk '{print $5}'
    assert "Server Index                   : 2" in out
    assert sdid == (2 << 22) | (7 << 16)
    host4 = layout.bed_map(5, Path("/x")).host("node4")
    assert formats.sdid(host4, 0) == 16777216  # the documented sample: server index 4


def test_spod_info_rejects_ids_outside_the_8_by_2_layout() -> None:
    assert npu_smi("info", "-t", "spod-info", "-i", "8", "-c", "0").rc != 0
    assert npu_smi("info", "-t", "spod-info", "-i", "0", "-c", "2").rc != 0
    assert npu_smi("info", "-t", "spod-info", "-i", "0").rc == 2


def test_hccn_tool_single_line_outputs_match_the_documented_text() -> None:
    n1 = BED.host("node1").npus[5]
    assert hccn("-i", "5", "-link", "-g", host="node1").out == "link status: UP\n"
    assert hccn("-i", "5", "-net_health", "-g").out == "net health status: Success\n"
    assert hccn("-i", "5", "-speed", "-g").out == "Speed: 100000 Mb/s\n"  # tests/data/comm/published
    assert hccn("-i", "5", "-netdetect", "-g", host="node1").out == f"netdetect addr: {n1.gateway}\n"
    assert hccn("-i", "5", "-gateway", "-g", host="node1").out == f"default gateway:{n1.gateway}, Iface:eth5\n"
    assert hccn("-i", "5", "-ip", "-g", host="node1").out == f"ipaddr:{n1.ip}\nnetmask:255.255.255.0\n"
    vnic = hccn("-i", "5", "-vnic", "-g", host="node1").out
    assert vnic == f"vnic link status: UP\nvnic ipaddr: {n1.vnic_ip}\nvnic netmask: 255.255.255.0\n"
    tls = hccn("-i", "5", "-tls", "-g").out.splitlines()
    assert [line for line in tls if "switch" in line] == [
        "dev_id:5, tls switch[0](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), "
        "tls alarm time threshold[60]days"
    ]
    lldp = hccn("-i", "5", "-lldp", "-g", host="node1").out
    assert [line for line in lldp.splitlines() if "Ifname" in line] == ["\tIfname: 400GE1/2/3:2"]


def test_hccn_tool_accepts_options_in_any_order() -> None:
    assert hccn("-g", "-tls", "-i", "0").out == hccn("-i", "0", "-tls", "-g").out
    assert hccn("-i", "0", "-tls", "-s", "enable", "1").rc == 2  # set operations are not simulated
    assert hccn("-i", "0", "-g").rc == 2
    assert hccn("-i", "16", "-link", "-g").rc != 0


def test_faults_change_link_health_and_tls() -> None:
    f = Faults.parse('{"link_down": [3], "net_health": {"4": "Unreachable"}, "tls_switch": {"2": 1}}')
    assert hccn("-i", "3", "-link", "-g", faults=f).out == "link status: DOWN\n"
    assert hccn("-i", "2", "-link", "-g", faults=f).out == "link status: UP\n"
    assert hccn("-i", "4", "-net_health", "-g", faults=f).out == "net health status: Unreachable\n"
    assert "tls switch[1]" in hccn("-i", "2", "-tls", "-g", faults=f).out
    assert "tls switch[0]" in hccn("-i", "1", "-tls", "-g", faults=f).out
    whole_node = Faults.parse('{"tls_switch": 1, "net_health": [0]}')
    assert all("tls switch[1]" in hccn("-i", str(i), "-tls", "-g", faults=whole_node).out for i in range(16))
    assert hccn("-i", "0", "-net_health", "-g", faults=whole_node).out == "net health status: Fault\n"


def test_a_site_without_roce_answers_the_hccs_plane_and_fails_the_roce_address_queries() -> None:
    f = Faults.parse('{"no_roce": true}')
    peer = BED.host("node2").npus[0]
    for query in (["-ip", "-g"], ["-netdetect", "-g"], ["-gateway", "-g"], ["-ping", "-g", "address", peer.ip]):
        got = hccn("-i", "3", *query, faults=f)
        assert (got.rc, got.out) == (1, ""), query
        assert got.err == (
            "Get ipconf failed, because no ip was preset there!\n" if query[0] == "-ip" else "Command execute failed!\n"
        )
    assert hccn("-i", "3", "-vnic", "-g", faults=f).rc == 0
    assert hccn("-i", "3", "-hccs_ping", "-g", "address", peer.vnic_ip, faults=f).rc == 0
    assert hccn("-i", "3", "-ip", "-g").rc == 0  # healthy by default


def test_ping_succeeds_between_hosts_unless_a_fault_says_otherwise() -> None:
    peer = BED.host("node2").npus[0]
    out = hccn("-i", "0", "-ping", "-g", "address", peer.ip).out.splitlines()
    assert out[0] == f"device 0 PING {peer.ip}"
    assert out[1].startswith("recv seq=0,time=") and out[1].endswith("ms")
    assert out[-1] == "3 packets transmitted, 3 received, 0.00% packet loss"
    lossy = Faults.parse('{"ping_loss": ["node2"]}')
    assert hccn("-i", "0", "-ping", "-g", "address", peer.ip, faults=lossy).out.splitlines()[-1] == (
        "3 packets transmitted, 0 received, 100.00% packet loss"
    )
    other = BED.host("node1").npus[0]
    assert ping_replies(ctx(faults=lossy), 0, other.ip, 3) == 3
    by_ip = Faults.parse(json.dumps({"ping_loss": {peer.vnic_ip: 0.34}}))
    assert ping_replies(ctx(faults=by_ip), 0, peer.vnic_ip, 3) == 2
    assert ping_replies(ctx(), 0, "10.213.250.1", 3) == 0  # nobody owns it
    assert ping_replies(ctx(faults=Faults(link_down=frozenset({0}))), 0, peer.ip, 3) == 0
    peer_down = {"node2": Faults(link_down=frozenset({0}))}
    assert ping_replies(ctx(peers=peer_down), 0, peer.ip, 3) == 0
    assert ping_replies(ctx(peers=peer_down), 0, BED.host("node2").npus[1].ip, 3) == 3


def test_loss_on_the_peer_side_drops_the_replies() -> None:
    mine, peer = BED.host("node0").npus[4], BED.host("node2").npus[4]
    lossy_back = {"node2": Faults.parse('{"ping_loss": ["node0"]}')}
    assert ping_replies(ctx(peers=lossy_back), 4, peer.ip, 3) == 0
    assert ping_replies(ctx(peers=lossy_back), 4, BED.host("node1").npus[4].ip, 3) == 3
    one_address = {"node2": Faults.parse(json.dumps({"ping_loss": {mine.vnic_ip: 0.34}}))}
    assert ping_replies(ctx(peers=one_address), 4, peer.vnic_ip, 3) == 2  # the vNIC plane only
    assert ping_replies(ctx(peers=one_address), 4, peer.ip, 3) == 3
    both_ways = Faults.parse('{"ping_loss": {"node2": 0.5}}')
    half_back = {"node2": Faults.parse('{"ping_loss": {"node0": 0.5}}')}
    assert ping_replies(ctx(faults=both_ways, peers=half_back), 4, peer.ip, 4) == 1  # 1/2 × 1/2 arrive


def test_hccs_ping_follows_the_tool_printf_layout() -> None:
    target = BED.host("node3").npus[7].vnic_ip
    out = hccn("-i", "7", "-hccs_ping", "-g", "address", target, "cnt", "4").out
    assert out.startswith(f"device 7 PING {target}\n\nThis pkt ping success!\nrecv seq 0, time = ")
    assert "4 packets transmitted, 4 received, 0.00% packets loss" in out
    assert re.search(r"^TP95 time \d+\.\d{3}us$", out, re.M)
    lost = hccn("-i", "7", "-hccs_ping", "-g", "address", target, faults=Faults.parse('{"ping_loss": ["node3"]}')).out
    assert lost.count("This pkt check recv msg fail!") == 3 and "0 received, 100.00% packets loss" in lost
    assert hccn("-i", "7", "-hccs_ping", "-g").rc == 2


def test_hccn_conf_has_address_netmask_netdetect_gateway_per_npu() -> None:
    conf = formats.hccn_conf(BED.host("node1"))
    keys = dict(line.split("=", 1) for line in conf.splitlines())
    assert keys["address_0"] == BED.host("node1").npus[0].ip
    assert {f"{k}_{i}" for k in ("address", "netmask", "netdetect", "gateway") for i in range(16)} <= set(keys)


def test_npu_addresses_are_unique_across_a_16_host_bed() -> None:
    big = layout.bed_map(16, Path("/x"))
    ips = [a for h in big.hosts for n in h.npus for a in (n.ip, n.vnic_ip)]
    assert len(ips) == len(set(ips)) == 16 * 16 * 2
    assert all(ip.startswith("10.213.") for ip in ips)
    assert big.owner_of(big.host("node9").npus[4].vnic_ip)[0].name == "node9"  # type: ignore[index]


@pytest.mark.parametrize(
    "text",
    [
        "[1]",
        '{"link_down": [16]}',
        '{"link_down": "3"}',
        '{"net_health": {"1": "Broken"}}',
        '{"tls_switch": 2}',
        '{"ping_loss": {"node1": 1.5}}',
        '{"unknown": 1}',
        '{"no_roce": 1}',
        "{not json",
    ],
)
def test_bad_fault_files_are_rejected_with_a_reason(text: str) -> None:
    with pytest.raises(FaultError):
        Faults.parse(text)


def test_empty_fault_file_means_healthy() -> None:
    assert Faults.parse("") == Faults() == Faults.parse("{}\n")


def test_main_reads_the_bed_map_and_faults_from_the_sim_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bed.json").write_text(json.dumps(BED.to_json()))
    (tmp_path / "faults.json").write_text('{"link_down": [1]}')
    monkeypatch.setenv("NPU_SIM_DIR", str(tmp_path))
    monkeypatch.setattr("os.uname", lambda: type("U", (), {"nodename": "node1"})())
    assert main("hccn_tool", ["-i", "1", "-link", "-g"]) == 0
    assert capsys.readouterr().out == "link status: DOWN\n"
    (tmp_path / "faults.json").write_text('{"link_down": [99]}')
    assert main("npu-smi", ["info"]) == 3
    assert "invalid" in capsys.readouterr().err
    assert BedMap.from_json(json.loads((tmp_path / "bed.json").read_text())) == BED
