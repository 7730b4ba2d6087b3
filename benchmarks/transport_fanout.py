"""Fan-out cost: one command on 1..N test-bed hosts at once, against running it host after host.

Needs a running test bed (`python -m testbed up --hosts N`). Prints a Markdown table.
    python benchmarks/transport_fanout.py [--repeat 10] [--command 'sleep 0.2; hostname']
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from k3deploy.tasks.transport import SSHTransport, run_all
from testbed.layout import load_state, resolve_state_file


def timed(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--command", default="sleep 0.2; hostname")
    args = parser.parse_args()
    state = load_state(resolve_state_file())
    hosts = state.hosts
    nodes = {
        h.name: SSHTransport(
            h.ip, name=h.name, private_key_file=state.ssh["private_key"], known_hosts=state.ssh["known_hosts"]
        )
        for h in hosts
    }
    cold = time.perf_counter()
    run_all(nodes, "true", timeout=30)  # connect every host once; connections are reused after
    cold = time.perf_counter() - cold
    print(f"machine: {platform.machine()}, {platform.node()}; command: {args.command!r}; repeat {args.repeat}")
    print(f"first contact (connect + exec) on {len(nodes)} hosts in parallel: {cold:.3f} s\n")
    print("| hosts | parallel fan-out (s) | one after another (s) | parallel / 1-host parallel |")
    print("|---:|---:|---:|---:|")
    base = None
    counts = sorted({1, 2, 4, 8, 16, len(nodes)} & set(range(1, len(nodes) + 1)))
    for n in counts:
        subset = dict(list(nodes.items())[:n])
        par = timed(lambda s=subset: run_all(s, args.command, timeout=30), args.repeat)
        seq = timed(lambda s=subset: [t.run(args.command, 30) for t in s.values()], args.repeat)
        base = base or par
        print(f"| {n} | {par:.3f} | {seq:.3f} | {par / base:.2f} |")
    for t in nodes.values():
        t.close()


if __name__ == "__main__":
    main()
