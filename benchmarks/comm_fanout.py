"""Comm-stage fan-out: every comm check (local facts, then the cross-node ping mesh) on 4, 8 and 16 nodes.

Needs a running test bed (`python -m testbed up --hosts N`); it is only read, never restarted.
With fewer bed hosts than nodes, node k runs on bed host k mod H: its own SSH connection and
scripts, LOCAL_IP and NPU addresses of that host, so it does the same work a distinct host would.
(A second bed cannot run beside a shared one: `up` owns fixed netns and bridge names.)
Prints a Markdown table; "CPU-s" is the whole machine's busy time over the run (/proc/stat),
"k3deploy CPU-s" this process's own (SSH, rendering, parsing: what the controller pays).
A healthy bed gives 0 failed rows; failures (say, faults another session injected meanwhile)
are counted, not fatal: the tool calls, hence the work timed, are the same.

    python -m benchmarks.comm_fanout [--counts 4 8 16] [--repeat 3] [--no-hccs-ping] [--parallel 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from blocks.cluster import ClusterConfig, NodeSpec
from blocks.serve import ServeConfig
from tasks.comm import CommReport, ToolPaths, run_comm_checks
from tasks.comm.runner import phase1_sections
from tasks.transport import run_all, transports_for
from testbed.layout import BedState, load_state, resolve_state_file

TIMEOUT_S = 600


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores)."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cluster_of(state: BedState, count: int) -> ClusterConfig:
    hosts = state.hosts
    nodes = [NodeSpec(name=f"n{k:02d}", address=hosts[k % len(hosts)].ip, nic="eth0") for k in range(count)]
    ssh = {"known_hosts": state.ssh["known_hosts"], "private_key_file": state.ssh["private_key"]}
    return ClusterConfig(nodes=nodes, model_root="/srv/models", ssh=ssh)


def tool_calls(report: CommReport, count: int) -> int:
    """Tool invocations of one run: phase-1 sections of every node plus one per ping row."""
    local = count * len(phase1_sections(16, ToolPaths())) + 1  # + node 0's `ss`
    return local + sum(r.check in ("ping", "hccs_ping") for r in report.rows)


def measure(state: BedState, count: int, repeat: int, hccs: bool, parallel: int) -> dict[str, float]:
    cluster = cluster_of(state, count)
    transports = transports_for(cluster)
    try:
        cold = time.perf_counter()
        run_all(transports, "true", timeout=30)  # connect once; the stage reuses connections the same way
        cold = time.perf_counter() - cold
        runs = []
        for _ in range(repeat):
            cpu, own, wall = busy_seconds(), time.process_time(), time.perf_counter()
            report = run_comm_checks(transports, cluster, ServeConfig(), TIMEOUT_S, hccs_ping=hccs, parallel=parallel)
            runs.append((time.perf_counter() - wall, busy_seconds() - cpu, report, time.process_time() - own))
    finally:
        for t in transports.values():
            t.close()
    wall, cpu, report, own = sorted(runs, key=lambda r: r[0])[len(runs) // 2]  # the median run
    return {
        "nodes": count,
        "hosts": min(count, len(state.hosts)),
        "rows": len(report.rows),
        "failed": max(len(r[2].failures) for r in runs),
        "calls": tool_calls(report, count),
        "local": statistics.median(r[2].phase_seconds["local"] for r in runs),
        "pings": statistics.median(r[2].phase_seconds["pings"] for r in runs),
        "total": wall,
        "cpu": cpu,
        "own": own,
        "cold": cold,
        "failures": [f"{r.node} NPU {r.npu} {r.check} {r.peer or ''}: {r.detail}" for x in runs for r in x[2].failures],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=16, help="tool calls a node runs at once")
    parser.add_argument("--no-hccs-ping", action="store_true")
    args = parser.parse_args()
    state = load_state(resolve_state_file())
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"bed hosts: {len(state.hosts)}; repeat {args.repeat} (median); parallel {args.parallel}; "
        f"hccs_ping {'off' if args.no_hccs_ping else 'on'}; load average before: {os.getloadavg()[0]:.1f}\n"
    )
    print("| nodes | bed hosts | rows | failed rows | tool calls | local phase (s) | ping phase (s) | total (s) "
          f"| CPU-s | k3deploy CPU-s | calls / s | total / {args.counts[0]}-node total |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base, colds, notes = None, [], []
    for count in args.counts:
        m = measure(state, count, args.repeat, not args.no_hccs_ping, args.parallel)
        base = base or m
        print(
            f"| {count} | {m['hosts']} | {m['rows']} | {m['failed']} | {m['calls']} | {m['local']:.2f} "
            f"| {m['pings']:.2f} | {m['total']:.2f} | {m['cpu']:.1f} | {m['own']:.2f} | {m['calls'] / m['total']:.0f} "
            f"| {m['total'] / base['total']:.2f} |",
            flush=True,
        )
        colds.append(f"{count} nodes {m['cold']:.3f} s")
        notes += [f"- {count} nodes: {line}" for line in m["failures"][:10]]
    print(f"\nfirst contact (connect + one exec) on all nodes in parallel: {', '.join(colds)}")
    if notes:
        print("\nfailed rows (up to 10 per node count):\n" + "\n".join(notes))


if __name__ == "__main__":
    main()
