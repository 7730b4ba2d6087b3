"""Comm-stage fan-out: every comm check (local facts, then the cross-node ping mesh) on 4, 8 and 16 hosts.

Needs a running test bed with at least as many hosts as the largest count
(`python -m testbed up --hosts 16`); it is only read, never restarted. Node k is bed host k.
`--host-cpu C` caps every host at C cores (see `host_cpu`), so that hosts stop sharing this
machine's cores and each behaves as its own machine; without it, all hosts' tools share them.
Prints a Markdown table; "CPU-s" is the whole machine's busy time over the run (/proc/stat),
"k3deploy CPU-s" this process's own (SSH, rendering, parsing: what the controller pays),
"busiest host CPU-s" the most any one host used (with --host-cpu only).
A healthy bed gives 0 failed rows; failures (say, faults another session injected meanwhile)
are counted, not fatal: the tool calls, hence the work timed, are the same.

    python -m benchmarks.comm_fanout [--counts 4 8 16] [--repeat 3] [--host-cpu 0.1] [--no-hccs-ping]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time
from typing import Any

from benchmarks.host_cpu import HostCpuLimits
from k3deploy.blocks.cluster import ClusterConfig, NodeSpec
from k3deploy.blocks.serve import ServeConfig
from k3deploy.tasks.comm import CommReport, ToolPaths, run_comm_checks
from k3deploy.tasks.comm.runner import phase1_sections
from k3deploy.tasks.transport import run_all
from k3deploy.tasks.transport.factory import open_transports
from testbed.layout import BedState, load_state, resolve_state_file

TIMEOUT_S = 600


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores)."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cluster_of(state: BedState, count: int) -> ClusterConfig:
    nodes = [NodeSpec(name=h.name, address=h.ip, nic="eth0") for h in state.hosts[:count]]
    ssh = {"known_hosts": state.ssh["known_hosts"], "private_key_file": state.ssh["private_key"]}
    return ClusterConfig(nodes=nodes, model_root="/srv/models", ssh=ssh)


def tool_calls(report: CommReport, count: int) -> int:
    """Tool invocations of one run: phase-1 sections of every node plus one per ping row."""
    local = count * len(phase1_sections(16, ToolPaths())) + 1  # + node 0's `ss`
    return local + sum(r.check in ("ping", "hccs_ping") for r in report.rows)


def measure(
    state: BedState, count: int, repeat: int, hccs: bool, parallel: int, limits: HostCpuLimits | None
) -> dict[str, Any]:
    cluster = cluster_of(state, count)
    with open_transports(cluster) as transports:
        cold = time.perf_counter()
        run_all(transports, "true", timeout=30)  # connect once; the stage reuses connections the same way
        cold = time.perf_counter() - cold
        runs = []
        for _ in range(repeat):
            hosts = limits.usage() if limits else {}
            cpu, own, wall = busy_seconds(), time.process_time(), time.perf_counter()
            report = run_comm_checks(transports, cluster, ServeConfig(), TIMEOUT_S, hccs_ping=hccs, parallel=parallel)
            wall, cpu, own = time.perf_counter() - wall, busy_seconds() - cpu, time.process_time() - own
            busiest = max((v - hosts[k] for k, v in limits.usage().items()), default=0.0) if limits else None
            runs.append((wall, cpu, report, own, busiest))
    wall, cpu, report, own, busiest = sorted(runs, key=lambda r: r[0])[len(runs) // 2]  # the median run
    return {
        "rows": len(report.rows),
        "failed": max(len(r[2].failures) for r in runs),
        "calls": tool_calls(report, count),
        "local": statistics.median(r[2].phase_seconds["local"] for r in runs),
        "pings": statistics.median(r[2].phase_seconds["pings"] for r in runs),
        "total": wall,
        "cpu": cpu,
        "own": own,
        "busiest": "n/a" if busiest is None else f"{busiest:.2f}",
        "cold": cold,
        "failures": [f"{r.node} NPU {r.npu} {r.check} {r.peer or ''}: {r.detail}" for x in runs for r in x[2].failures],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=16, help="tool calls a node runs at once")
    parser.add_argument("--host-cpu", type=float, help="cap every bed host at this many cores (cgroup v1)")
    parser.add_argument("--no-hccs-ping", action="store_true")
    args = parser.parse_args()
    state = load_state(resolve_state_file())
    if len(state.hosts) < max(args.counts):
        raise SystemExit(f"the bed has {len(state.hosts)} hosts; run `python -m testbed up --hosts {max(args.counts)}`")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"bed hosts: {len(state.hosts)}; host CPU cap: {args.host_cpu or 'none (hosts share the machine)'}; "
        f"repeat {args.repeat} (median); parallel {args.parallel}; "
        f"hccs_ping {'off' if args.no_hccs_ping else 'on'}; load average before: {os.getloadavg()[0]:.1f}\n"
    )
    print("| hosts | rows | failed rows | tool calls | local phase (s) | ping phase (s) | total (s) | CPU-s "
          f"| k3deploy CPU-s | busiest host CPU-s | total / {args.counts[0]}-host total |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base, colds, notes = None, [], []
    limits = HostCpuLimits(state.hosts[: max(args.counts)], args.host_cpu) if args.host_cpu else None
    with limits or contextlib.nullcontext():
        for count in args.counts:
            m = measure(state, count, args.repeat, not args.no_hccs_ping, args.parallel, limits)
            base = base or m
            print(
                f"| {count} | {m['rows']} | {m['failed']} | {m['calls']} | {m['local']:.2f} | {m['pings']:.2f} "
                f"| {m['total']:.2f} | {m['cpu']:.1f} | {m['own']:.2f} | {m['busiest']} "
                f"| {m['total'] / base['total']:.2f} |",
                flush=True,
            )
            colds.append(f"{count} hosts {m['cold']:.3f} s")
            notes += [f"- {count} hosts: {line}" for line in m["failures"][:10]]
    print(f"\nfirst contact (connect + one exec) on all hosts in parallel: {', '.join(colds)}")
    if notes:
        print("\nfailed rows (up to 10 per host count):\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
