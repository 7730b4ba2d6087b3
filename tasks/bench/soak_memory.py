"""Each rank's memory as the soak reads it after every window: the server's own (its process group's resident
memory, or its container's use, from the serving runtime), the memory still free on its node (/proc/meminfo's
MemAvailable) and, on Ascend nodes, its NPUs' HBM from `npu-smi info`. Parsers apart from the one reader."""

from __future__ import annotations

import re
import shlex

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.tasks.node_facts import ToolPaths
from k3deploy.tasks.render import NodePlan, Plan
from k3deploy.tasks.runtime import serving_runtimes
from k3deploy.tasks.transport.factory import open_transports

MEMINFO = "awk '/^MemAvailable:/ {print $2}' /proc/meminfo"
MIB = 1024 * 1024
# `npu-smi info`'s chip row: `| 0     0   | 0000:9D:00.0  | 0   0    / 0    3430 / 65536   |` (A3), HBM used / total
# in MB in its last column (tests/data/comm/published/npu-smi-info-a3.txt, a real A3's).
_HBM_ROW = re.compile(r"^\|\s*\d+(?:\s+\d+)?\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*\|.*?"
                      r"(\d+)\s*/\s*(\d+)\s*\|\s*$")  # fmt: skip


def rank_label(plan: NodePlan) -> str:
    return f"{plan.node} (DP rank {plan.dp_rank})"


def parse_meminfo(text: str) -> int | None:
    """MemAvailable in bytes; None when /proc/meminfo did not say."""
    value = text.strip()
    return int(value) * 1024 if value.isdigit() else None


def parse_hbm(text: str) -> tuple[int, int] | None:
    """(used, total) HBM in bytes over every chip `npu-smi info` lists; None without chip rows."""
    rows = []
    for line in text.splitlines():
        if "Process id" in line:  # the process table follows
            break
        if m := _HBM_ROW.match(line):
            rows.append((int(m[1]), int(m[2])))
    if not rows:
        return None
    return sum(u for u, _ in rows) * MIB, sum(t for _, t in rows) * MIB


def read_memory(cfg: DeploymentConfig, plan: Plan) -> dict[str, dict[str, int | None]]:
    """rank → {"bytes", "free", "hbm_used", "hbm_total"} now; a value the node could not give is None."""
    out: dict[str, dict[str, int | None]] = {}
    npus = cfg.cluster.npus_per_node > 0
    with serving_runtimes(cfg) as runtimes, open_transports(cfg.cluster) as transports:
        for node in plan.nodes:
            spec = node.container or node.process
            assert spec is not None, "a node plan renders a container or a process"
            host = transports[node.node]
            free = host.run(MEMINFO, timeout=60)
            hbm = None
            if npus:
                smi = host.run(f"{shlex.quote(ToolPaths().npu_smi)} info", timeout=60)
                hbm = parse_hbm(smi.stdout) if smi.exit_code == 0 else None
            out[rank_label(node)] = {
                "bytes": runtimes[node.node].memory(spec.name),
                "free": parse_meminfo(free.stdout) if free.exit_code == 0 else None,
                "hbm_used": hbm[0] if hbm else None,
                "hbm_total": hbm[1] if hbm else None,
            }
    return out
