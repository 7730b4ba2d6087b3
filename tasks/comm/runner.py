"""Run the comm checks on every node: phase 1 local facts, phase 2 cross-node pings.

One batched script per node per phase (see `batch`), all nodes at once (`run_all`). Phase 2
is planned from the NPU addresses phase 1 read, so a node that is down or an NPU that is
absent is reported once, as itself, and never aborts the other nodes' checks.

What runs follows the configuration: `cluster.npus_per_node: 0` declares no NPUs, so every NPU
group (npu-smi, hccn_tool, spod-info, hccn.conf, the ping mesh, the NPU driver's versions) is
left out of the plan and reported as not applicable, and only the host checks run.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from k3deploy.blocks.cluster import COMM_PLANES, ClusterConfig, NodeSpec
from k3deploy.blocks.serve import ServeConfig
from k3deploy.core.errors import CommandTimeout, TransportError
from k3deploy.core.stage import Finding
from k3deploy.tasks import node_facts as nf
from k3deploy.tasks.batch import Section, SectionOutput, first_line, parse_output, render_script
from k3deploy.tasks.comm import host_checks as hc
from k3deploy.tasks.comm import npu_checks as nc
from k3deploy.tasks.comm.checks import NPU_GROUPS, PER_NPU, PLANE_CHECKS
from k3deploy.tasks.comm.cross import Key, PingTarget, consistent, ping_plan
from k3deploy.tasks.comm.finding import fail
from k3deploy.tasks.comm.report import CommReport, NotApplicable, sort_rows
from k3deploy.tasks.transport import Transport, run_all

MAX_SECTIONS = 1000  # per script: keeps it well under the remote shell's 128 KiB argument limit
BUSY_ATTEMPTS = 5  # a busy hccn_tool is asked again after 1, 2, 3, 4 s


@dataclass
class NodeFacts:
    """What phase 1 learnt on one node: its rows and the values later steps compare or use."""

    node: str
    rows: list[Finding] = field(default_factory=list)
    values: dict[str, dict[int, str]] = field(default_factory=dict)  # check → NPU → its `value` (checks.py)
    driver: str | None = None
    firmware: str | None = None

    @property
    def nic_ips(self) -> dict[int, str]:
        return self.values.get("ip", {})

    @property
    def vnic_ips(self) -> dict[int, str]:
        return self.values.get("vnic", {})

    @property
    def tls(self) -> dict[int, str]:
        return self.values.get("tls", {})

    @property
    def super_pod(self) -> dict[int, str]:
        return self.values.get("spod_info", {})


NO_NPUS = "cluster.npus_per_node is 0: no NPUs declared"


def not_applicable(npus: int, planes: Sequence[str] = COMM_PLANES) -> tuple[NotApplicable, ...]:
    """The check groups the configuration rules out: with no NPUs declared every NPU group, else the
    checks of each network plane the site does not run (cluster.comm_planes)."""
    if npus == 0:
        return tuple(NotApplicable(group, checks, NO_NPUS, "no NPUs declared") for group, checks in NPU_GROUPS)
    return tuple(
        NotApplicable(f"{plane} plane", checks, f"cluster.comm_planes has no {plane}", f"no {plane} plane")
        for plane, checks in PLANE_CHECKS.items()
        if plane not in planes
    )


def section_check(key: str) -> str:
    """The check a phase-1 section feeds (`link:3` → link, `links` → nic, `addrs` → local_ip)."""
    check = key.partition(":")[0]
    return {"links": "nic", "addrs": "local_ip"}.get(check, check)


def phase1_sections(
    npus: int, tools: nc.ToolPaths, ports: Mapping[str, int] | None = None, planes: Sequence[str] = COMM_PLANES
) -> list[Section]:
    """Every local check of one node, `npu-smi info` first; `ports` (node 0 only) adds `ss -Hltn`.

    The groups `not_applicable(npus)` names are left out: with 0 NPUs, the NIC, LOCAL_IP and ports only.
    """
    sections = [Section("npu_smi", tuple(nc.npu_smi_info_cmd(tools)))]
    for npu in range(npus):
        sections += [Section(f"{c.name}:{npu}", tuple(c.command(tools, npu))) for c in PER_NPU if c.command]
    sections += [
        Section("hccn_conf", tuple(hc.hccn_conf_cmd(tools))),
        Section("links", tuple(hc.ip_link_cmd())),
        Section("addrs", tuple(hc.ip_addr_cmd())),
        Section("driver_version", tuple(nf.version_info_cmd(tools))),
        Section("firmware_version", tuple(nf.board_info_cmd(tools))),
    ]
    if ports:
        sections.append(Section("ports", tuple(nf.listening_cmd())))
    skipped = {check for group in not_applicable(npus, planes) for check in group.checks}
    return [s for s in sections if section_check(s.key) not in skipped]


def _cut_short(node: str, key: str, ports: Mapping[str, int] | None) -> list[Finding]:
    """The rows a section stands for, failed because the script never printed it."""
    why = "no output: the batch was cut short before this check"
    if key == "ports":
        return [fail(node, None, name, why) for name in ports or {}]
    npu = key.partition(":")[2]
    return [fail(node, int(npu) if npu else None, section_check(key), why)]


def interpret_phase1(
    node: NodeSpec,
    outputs: Mapping[str, SectionOutput],
    npus: int,
    ports: Mapping[str, int] | None = None,
    planes: Sequence[str] = COMM_PLANES,
) -> NodeFacts:
    """Rows and values of one node from its parsed phase-1 sections (pure)."""
    name, facts = node.name, NodeFacts(node.name)
    for section in phase1_sections(npus, nc.ToolPaths(), ports, planes):
        if section.key not in outputs:
            facts.rows += _cut_short(name, section.key, ports)
    if got := outputs.get("npu_smi"):
        facts.rows += nc.parse_npu_smi_info(name, got.text, got.rc, npus)
    for npu in range(npus):
        for check in PER_NPU:
            if (got := outputs.get(f"{check.name}:{npu}")) is None or check.parse is None:
                continue
            facts.rows += check.parse(name, npu, got.text, got.rc)
            if check.value is not None and got.ok and (value := check.value(got.text)):
                facts.values.setdefault(check.name, {})[npu] = value
    if got := outputs.get("hccn_conf"):
        facts.rows += hc.parse_hccn_conf(name, got.text, got.rc, npus, facts.nic_ips)
    links, addrs = outputs.get("links"), outputs.get("addrs")
    if links or addrs:  # a missing one already failed its row as cut short
        rows = hc.parse_nic(name, node.nic, node.serving_ip, links.text if links else "", addrs.text if addrs else "")
        facts.rows += [r for r in rows if (r.check == "nic" and links) or (r.check == "local_ip" and addrs)]
    if got := outputs.get("driver_version"):
        rows, facts.driver = hc.parse_version(name, "driver_version", got.text, got.rc)
        facts.rows += rows
    if got := outputs.get("firmware_version"):
        rows, facts.firmware = hc.parse_version(name, "firmware_version", got.text, got.rc)
        facts.rows += rows
    if ports and (got := outputs.get("ports")):
        facts.rows += hc.parse_free_ports(name, got.text, got.rc, ports)
    return facts


def cross_node(facts: Mapping[str, NodeFacts]) -> list[Finding]:
    """Every node's rows, with TLS switch, Super Pod ID, driver and firmware compared across nodes."""
    rows = [r for f in facts.values() for r in f.rows]
    compared: dict[str, tuple[str, Mapping[Key, str]]] = {
        c.name: (c.compared_as, {(n, npu): v for n, f in facts.items() for npu, v in f.values.get(c.name, {}).items()})
        for c in PER_NPU
        if c.compared_as
    }
    compared |= {
        "driver_version": ("driver", {(n, None): f.driver for n, f in facts.items() if f.driver}),
        "firmware_version": ("firmware", {(n, None): f.firmware for n, f in facts.items() if f.firmware}),
    }
    out = [r for r in rows if r.check not in compared]
    for check, (what, values) in compared.items():
        out += consistent([r for r in rows if r.check == check], values, what)
    return out


def phase2_sections(targets: list[PingTarget], tools: nc.ToolPaths) -> list[Section]:
    return [Section(t.key, tuple(nc.ping_cmd(tools, t.npu, t.address, hccs=t.hccs))) for t in targets]


def interpret_phase2(node: str, targets: list[PingTarget], outputs: Mapping[str, SectionOutput]) -> list[Finding]:
    """One ping / hccs_ping row per target (a target with no output fails as cut short)."""
    rows = []
    for t in targets:
        got = outputs.get(t.key)
        if got is None:
            rows.append(fail(node, t.npu, t.check, f"to {t.peer} NPU {t.peer_npu} {t.address}: no output", t.peer))
            continue
        rows += nc.parse_ping(
            node, t.npu, got.text, got.rc, peer=t.peer, peer_npu=t.peer_npu, address=t.address, hccs=t.hccs
        )
    return rows


def _run_batches(
    transports: Mapping[str, Transport],
    plans: Mapping[str, list[Section]],
    timeout: float,
    parallel: int,
    section_timeout: float,
) -> tuple[dict[str, dict[str, SectionOutput]], list[Finding]]:
    """Run each node's sections as one script (a very long plan: a few, in turn); a node that fails
    as a whole becomes one row and is not asked again."""
    outputs: dict[str, dict[str, SectionOutput]] = {}
    rows: list[Finding] = []
    dead: set[str] = set()
    for start in range(0, max((len(p) for p in plans.values()), default=0), MAX_SECTIONS):
        token = secrets.token_hex(8)
        chunks = {name: secs[start : start + MAX_SECTIONS] for name, secs in plans.items() if name not in dead}
        scripts = {
            name: render_script(
                chunk, token, parallel=parallel, section_timeout=section_timeout, busy=nc.BUSY, attempts=BUSY_ATTEMPTS
            )
            for name, chunk in chunks.items()
            if chunk
        }
        # Queries only (npu-smi, hccn_tool, ip, ss, cat, ping): a script whose connection drops runs again.
        targets = {name: transports[name] for name in scripts}
        results = (
            run_all(targets, scripts, timeout, idempotent=True, purpose="running the comm checks") if targets else {}
        )
        for name, result in results.items():
            if isinstance(result, CommandTimeout):
                rows.append(fail(name, None, "batch", f"checks did not finish within {timeout:g}s: {result}"))
            elif isinstance(result, TransportError):
                rows.append(fail(name, None, "reach", str(result)))
            elif parsed := parse_output(chunks[name], result.stdout, token):
                outputs.setdefault(name, {}).update(parsed)
                continue
            else:
                why = first_line(result.stderr or result.stdout)
                rows.append(fail(name, None, "batch", f"check script exited {result.exit_code}: {why}"))
            dead.add(name)
    return outputs, rows


def run_comm_checks(
    transports: Mapping[str, Transport],
    cluster: ClusterConfig,
    serve: ServeConfig,
    timeout: float = 300.0,
    *,
    tools: nc.ToolPaths | None = None,
    parallel: int = 16,
    section_timeout: float = 30.0,
    hccs_ping: bool = True,
) -> CommReport:
    """Every comm check on every node of `cluster`; failures are rows, never exceptions.

    `timeout` bounds each phase's script per node; `section_timeout` each tool call in it;
    `parallel` is how many tool calls a node runs at once. The groups the configuration rules
    out (no NPUs declared) are not run and come back as the report's `not_applicable`.
    """
    tools = tools or nc.ToolPaths()
    names = [n.name for n in cluster.nodes]
    missing = [n for n in names if n not in transports]
    if missing:
        raise ValueError(f"no transport for node(s): {', '.join(missing)}")
    npus = cluster.npus_per_node
    planes = cluster.comm_planes
    inapplicable = not_applicable(npus, planes)
    skipped = {check for group in inapplicable for check in group.checks}
    node0_ports = {"service_port": serve.service_port, "rpc_port": serve.rpc_port}
    ports = {n.name: node0_ports if i == 0 else None for i, n in enumerate(cluster.nodes)}

    started = time.monotonic()
    plans = {name: phase1_sections(npus, tools, ports[name], planes) for name in names}
    outputs, rows = _run_batches(transports, plans, timeout, parallel, section_timeout)
    facts = {n.name: interpret_phase1(n, outputs[n.name], npus, ports[n.name], planes) for n in cluster.nodes
             if n.name in outputs}  # fmt: skip
    rows += cross_node(facts)
    phase1 = time.monotonic() - started

    nic = {name: f.nic_ips for name, f in facts.items()}
    vnic = {name: f.vnic_ips for name, f in facts.items()}
    targets = {
        name: (ping_plan(name, nic) if "ping" not in skipped else [])
        + (ping_plan(name, vnic, hccs=True) if hccs_ping and "hccs_ping" not in skipped else [])
        for name in facts
    }
    plans2 = {name: phase2_sections(t, tools) for name, t in targets.items()}
    outputs2, rows2 = _run_batches(transports, plans2, timeout, parallel, section_timeout)
    rows += rows2
    for name, node_targets in targets.items():
        if name in outputs2:
            rows += interpret_phase2(name, node_targets, outputs2[name])
    phase2 = time.monotonic() - started - phase1
    return CommReport(
        tuple(names),
        tuple(sort_rows(rows, names)),
        {"local": round(phase1, 3), "pings": round(phase2, 3)},
        inapplicable,
    )
