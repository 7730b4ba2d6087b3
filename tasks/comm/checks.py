"""The comm checks as data: one table from which the phase-1 plan, the parsers, the report's order and
groups, and the network planes are all derived (as the smoke checks are one table in tasks/smoke/checks.py).

A per-NPU check has a command builder and a parser (tasks/comm/npu_checks.py, pure, tested on real
output), and optionally a value extractor: what phase 2 pings (`ip`, `vnic`) or what must agree on every
NPU of every node (`compared_as`). The node-level checks (npu-smi, hccn.conf, the pings, driver and
firmware) have their own steps in the runner and are listed here for their group, plane and order.
Adding a per-NPU check is one entry here plus its parser and its real-output test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from k3deploy.core.stage import Finding
from k3deploy.tasks.comm import npu_checks as nc
from k3deploy.tasks.node_facts import ToolPaths

Plane = Literal["roce", "hccs"]


@dataclass(frozen=True)
class CommCheck:
    """One check: its report group, the network plane it belongs to (None: every site runs it), and for a
    per-NPU check how to ask (`command`), how to judge (`parse`) and what value to keep (`value`)."""

    name: str
    group: str
    plane: Plane | None = None
    command: Callable[[ToolPaths, int], list[str]] | None = None
    parse: Callable[[str, int, str, int | None], list[Finding]] | None = None
    value: Callable[[str], str | None] | None = None
    compared_as: str | None = None  # the value must agree across every NPU of every node, named so

    @property
    def per_npu(self) -> bool:
        return self.command is not None


def _hccn(query: str) -> Callable[[ToolPaths, int], list[str]]:
    return lambda tools, npu: nc.hccn_cmd(tools, npu, query)


def _super_pod_id(text: str) -> str | None:
    return nc.spod_fields(text).get("Super Pod ID") or None


# The vLLM-Ascend multi-node guide's order: how one NPU's rows are shown.
NPU_TABLE: tuple[CommCheck, ...] = (
    CommCheck("npu_smi", "npu-smi info"),
    CommCheck("lldp", "hccn_tool", "roce", _hccn("lldp"), nc.parse_lldp),
    CommCheck("link", "hccn_tool", "roce", _hccn("link"), nc.parse_link),
    CommCheck("speed", "hccn_tool", "roce", _hccn("speed"), nc.parse_speed, nc.link_speed, "port speed (Mb/s)"),
    CommCheck("net_health", "hccn_tool", "roce", _hccn("net_health"), nc.parse_net_health),
    CommCheck("netdetect", "hccn_tool", "roce", _hccn("netdetect"), nc.parse_netdetect),
    CommCheck("gateway", "hccn_tool", "roce", _hccn("gateway"), nc.parse_gateway),
    CommCheck("hccn_conf", "hccn.conf", "roce"),
    CommCheck("ip", "hccn_tool", "roce", _hccn("ip"), nc.parse_ip, nc.npu_ip),
    CommCheck("tls", "hccn_tool", "roce", _hccn("tls"), nc.parse_tls, nc.tls_switch, "tls switch"),
    CommCheck("vnic", "hccn_tool", "hccs", _hccn("vnic"), nc.parse_vnic, nc.vnic_ip),
    CommCheck("spod_info", "spod-info", "hccs", nc.spod_info_cmd, nc.parse_spod_info, _super_pod_id, "Super Pod ID"),
    CommCheck("ping", "ping mesh", "roce"),
    CommCheck("hccs_ping", "ping mesh", "hccs"),
)
# Host rows, in the order shown; the driver and firmware are the NPU driver's (an NPU group of their own).
HOST_TABLE: tuple[CommCheck, ...] = (
    CommCheck("reach", ""),
    CommCheck("batch", ""),
    CommCheck("nic", ""),
    CommCheck("local_ip", ""),
    CommCheck("service_port", ""),
    CommCheck("rpc_port", ""),
    CommCheck("driver_version", "driver/firmware"),
    CommCheck("firmware_version", "driver/firmware"),
)

PER_NPU: tuple[CommCheck, ...] = tuple(c for c in NPU_TABLE if c.per_npu)
HCCN_QUERIES: tuple[str, ...] = tuple(c.name for c in PER_NPU if c.group == "hccn_tool")
PARSERS: dict[str, Callable[[str, int, str, int | None], list[Finding]]] = {
    c.name: c.parse for c in PER_NPU if c.parse is not None
}
HOST_CHECKS: tuple[str, ...] = tuple(c.name for c in HOST_TABLE)
NPU_CHECKS: tuple[str, ...] = tuple(c.name for c in NPU_TABLE)
PLANE_CHECKS: dict[str, tuple[str, ...]] = {
    plane: tuple(c.name for c in NPU_TABLE if c.plane == plane) for plane in ("roce", "hccs")
}
GROUPS = ("npu-smi info", "hccn_tool", "spod-info", "hccn.conf", "ping mesh", "driver/firmware")  # as reported
NPU_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (group, tuple(c.name for c in NPU_TABLE + HOST_TABLE if c.group == group)) for group in GROUPS
)
