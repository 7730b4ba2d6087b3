"""Host checks on recorded outputs: hccn.conf, NIC / LOCAL_IP, node 0's ports, versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.tasks import node_facts as nf
from k3deploy.tasks.comm import host_checks as hc

pytestmark = pytest.mark.comm
DATA = Path(__file__).parents[1] / "data" / "comm" / "healthy"
LINKS = (DATA / "ip_link.txt").read_text()
ADDRS = (DATA / "ip_addr.txt").read_text()


def test_recorded_interfaces_and_addresses():
    assert list(hc.interfaces(LINKS)) == ["lo", "eth0"]
    assert hc.interfaces(LINKS)["eth0"].startswith("2: eth0@if") and "\\" not in hc.interfaces(LINKS)["eth0"]
    assert hc.addresses(ADDRS)["eth0"][0] == "10.213.0.11"


def test_nic_that_owns_local_ip_passes():
    rows = hc.parse_nic("node1", "eth0", "10.213.0.11", LINKS, ADDRS)
    assert [(r.check, r.ok) for r in rows] == [("nic", True), ("local_ip", True)]
    assert rows[1].detail == "eth0 owns LOCAL_IP 10.213.0.11"


def test_missing_nic_is_named_with_the_interfaces_there():
    nic, local = hc.parse_nic("node1", "enp189s0f0", "10.213.0.11", LINKS, ADDRS)
    assert (nic.ok, nic.detail) == (False, "NIC enp189s0f0 does not exist on node1; interfaces: lo, eth0")
    assert (local.ok, local.detail) == (False, "enp189s0f0 does not own LOCAL_IP 10.213.0.11; it is on eth0")


def test_local_ip_nobody_owns_fails():
    nic, local = hc.parse_nic("node1", "eth0", "192.0.2.11", LINKS, ADDRS)
    assert nic.ok and not local.ok and local.detail.endswith("no interface has it")


def test_ports_free_and_taken():
    ss = (DATA / "ss_node0.txt").read_text()
    rows = hc.parse_free_ports("node0", ss, 0, {"service_port": 8000, "rpc_port": 22})
    assert [(r.check, r.ok) for r in rows] == [("service_port", True), ("rpc_port", False)]
    assert rows[1].detail == "port 22 is taken: LISTEN 0      128    10.213.0.10:22 0.0.0.0:*"


def test_ipv6_and_wildcard_listeners_count():
    ss = "LISTEN 0 4096 [::]:13345 [::]:*\nLISTEN 0 511 *:8000 *:*\n"
    assert set(nf.listening(ss)) == {13345, 8000}


def test_hccn_conf_agrees_with_the_npu_addresses():
    text = (DATA / "hccn_conf.txt").read_text()
    ips = {i: f"10.213.{64 + i}.11" for i in range(16)}
    assert all(r.ok for r in hc.parse_hccn_conf("node1", text, 0, 16, ips))
    rows = hc.parse_hccn_conf("node1", text, 0, 16, ips | {4: "10.9.9.9"})
    assert [(r.npu, r.detail) for r in rows if not r.ok] == [(4, "address_4=10.213.68.11 but the NPU reports 10.9.9.9")]
    short = "\n".join(line for line in text.splitlines() if not line.startswith("address_12="))
    assert [r.npu for r in hc.parse_hccn_conf("node1", short, 0, 16, ips) if not r.ok] == [12]
    assert hc.parse_hccn_conf("node1", "cat: /etc/hccn.conf: No such file", 1, 16, ips)[0].npu is None


def test_versions():
    rows, value = hc.parse_version("node1", "driver_version", (DATA / "version_info.txt").read_text(), 0)
    assert value == "24.1.rc3.7" and rows[0].ok
    rows, value = hc.parse_version("node1", "firmware_version", (DATA / "board_info.txt").read_text(), 0)
    assert value == "7.5.0.5.220" and rows[0].ok
    rows, value = hc.parse_version("node1", "driver_version", "cat: no such file\n", 1)
    assert value is None and not rows[0].ok
