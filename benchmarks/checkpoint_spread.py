"""Time until every node holds a verified checkpoint: `stripe` against `per-node`, side by side, in two regimes.

Needs a running test bed (`python -m testbed up --hosts 4`). Publishes a checkpoint of `--files` shards (plus
the small files the content checks read) to a local hub on the bed's bridge address and runs the real
`models` flow (SSH, the node agent, the hub client's listing) on the bed's nodes, both distributions in
turn, each from empty model roots, `--repeat` times.

- uplink: the hub's egress shaped on the bed bridge (`tc … tbf rate RATE`), which caps what the hub sends to
  the nodes together while node-to-node traffic stays unshaped, as at a site; the physical limit is one copy
  through the uplink, `size / uplink`, and each time is given as a ratio to it.
- per-connection: no shaping; the hub sends each response at `--connection-mbps` at most (a hub or CDN that
  limits every connection); the ratio is per-node's time over stripe's.
- straggler: the uplink as in `uplink` (`--uplink-mbit 0`: unshaped), and node0 (the first stripe's holder)
  sending to each peer at `--straggler-mbit` (an htb class per peer on its own interface: a NIC that
  negotiated a lower speed, a congested switch port); per-node, the healthy stripe and the stripe with the
  straggler run alternately, and the straggler stripe's time is given over the healthy stripe's.

    python3 -m benchmarks.checkpoint_spread [--files 16 --file-mib 64 --uplink-mbit 400 --connection-mbps 2.5]
                                            [--repeat 2] [--threads 4] [--regime straggler --straggler-mbit 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from k3deploy.localhub import HubServer, publish
from k3deploy.tasks.transport import SSHTransport
from testbed.layout import load_state, resolve_state_file
from testbed.pytest_plugin import Testbed
from tests.bedconfig import bed_config, write_config
from tests.checkpoints import checkpoint_files
from tests.modelsbed import shape_per_peer

REPO = "k3bench/spread"
ROOT = "/srv/models/spread"
BRIDGE = "k3tb0"


@contextmanager
def uplink(mbit: int | None) -> Iterator[None]:
    """The bed bridge's egress (the hub's traffic to the nodes) shaped to `mbit`; None: unshaped."""
    if mbit is None:
        yield
        return
    shape = f"tc qdisc add dev {BRIDGE} root tbf rate {mbit}mbit burst 256kb latency 400ms"
    subprocess.run(shlex.split(shape), check=True)
    try:
        yield
    finally:
        subprocess.run(shlex.split(f"tc qdisc del dev {BRIDGE} root"), check=True)


@contextmanager
def straggler(bed: Testbed, nodes: dict[str, SSHTransport], mbit: int | None) -> Iterator[None]:
    """node0's egress to each other node shaped to `mbit`; None: as it is."""
    if mbit is None:
        yield
        return
    peers = [h.ip for h in bed.hosts[1 : len(nodes)]]
    shape_per_peer(nodes["node0"], peers, f"{mbit}mbit")
    try:
        yield
    finally:
        nodes["node0"].run("tc qdisc del dev eth0 root", 60).check()


def checkpoint(files: int, file_mib: int) -> dict[str, bytes]:
    small = checkpoint_files(1, shard_bytes=1)
    shards = {f"model-{i + 1:05d}-of-{files:05d}.safetensors": os.urandom(file_mib << 20) for i in range(files)}
    return {k: v for k, v in small.items() if not k.startswith("model-")} | shards


def one_run(
    bed: Testbed, hub: HubServer, folder: Path, nodes: dict[str, SSHTransport], distribution: str, threads: int
) -> dict:
    from k3deploy.flows.models import models

    for t in nodes.values():
        t.run(f"rm -rf {ROOT}", 120).check()
    data = bed_config(
        bed,
        len(nodes),
        models__hub="huggingface",
        models__hub_endpoint=hub.url,
        models__target={"repo": REPO},
        models__distribution=distribution,
        models__timeout_s=3600,
        models__threads=threads,
    )
    config = write_config(folder / f"{distribution}-{time.monotonic_ns()}.yaml", data)
    hub.clear_requests()
    started = time.perf_counter()
    result = models(config=config)
    seconds = time.perf_counter() - started
    assert result.verdict.value == "pass", result.summary
    rows = result.data["checkpoints"][0]["nodes"]
    return {
        "seconds": seconds,
        "hub_bytes": sum(r.sent for r in hub.requests if r.method == "GET" and "/resolve/" in r.path),
        "from_peers": sum(r["from peers bytes"] for r in rows),
    }


def regime(
    bed, hub, folder, nodes, repeat: int, which: str, threads: int, slowed: int | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Each distribution `repeat` times, alternating so all see the same machine; with `slowed`, the stripe once
    more with node0 sending to its peers at that many Mbit/s."""
    runs: dict[str, list[dict[str, Any]]] = {d: [] for d in ("per-node", "stripe") if which in ("both", d)}
    if slowed is not None:
        runs[f"stripe, node0 at {slowed} Mbit/s to peers"] = []
    for _ in range(repeat):
        for name in runs:
            distribution = "stripe" if name.startswith("stripe") else "per-node"
            with straggler(bed, nodes, slowed if name.startswith("stripe,") else None):
                runs[name].append(one_run(bed, hub, folder, nodes, distribution, threads))
            print(f"  {name}: {runs[name][-1]}", flush=True)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--file-mib", type=int, default=64)
    parser.add_argument("--uplink-mbit", type=int, default=400)
    parser.add_argument("--connection-mbps", type=float, default=2.5, help="MB/s per hub connection (regime 2)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4, help="models.threads (4, the default)")
    parser.add_argument("--regime", choices=["both", "uplink", "per-connection", "straggler"], default="both")
    parser.add_argument("--straggler-mbit", type=int, default=8, help="node0's rate to each peer (straggler)")
    parser.add_argument("--distribution", choices=["both", "stripe", "per-node"], default="both")
    args = parser.parse_args()

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    bed = Testbed.from_state(load_state(resolve_state_file(None)))
    nodes = {
        h.name: SSHTransport(h.ip, name=h.name, private_key_file=bed.key, known_hosts=bed.known_hosts)
        for h in bed.hosts[:4]
    }
    folder = Path(tempfile.mkdtemp(prefix="k3-spread-bench-"))
    os.environ["K3DEPLOY_RUNS_DIR"] = str(folder / "runs")
    files = checkpoint(args.files, args.file_mib)
    size = sum(map(len, files.values()))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {len(nodes)} bed nodes; checkpoint {len(files)} "
          f"files, {size / 1e9:.3f} GB ({args.files} × {args.file_mib} MiB shards); models.threads {args.threads}; "
          f"repeat {args.repeat}")  # fmt: skip
    quiet = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None, PREFECT_SERVER_ANALYTICS_ENABLED: False}
    table = []
    with temporary_settings(quiet), prefect_test_harness(server_startup_timeout=120):
        if args.regime in ("both", "uplink"):
            limit = size / (args.uplink_mbit * 1e6 / 8)
            print(f"uplink {args.uplink_mbit} Mbit/s: one copy's limit {limit:.1f} s")
            with HubServer(folder / "hub", host=bed.state.bridge["ip"]) as hub, uplink(args.uplink_mbit):
                publish(hub.root, REPO, files)
                runs = regime(bed, hub, folder, nodes, args.repeat, args.distribution, args.threads)
            for distribution, rs in runs.items():
                secs = statistics.median(r["seconds"] for r in rs)
                table.append(
                    (f"uplink {args.uplink_mbit} Mbit/s", distribution, secs, rs, f"{secs / limit:.2f} × limit")
                )
        if args.regime in ("both", "per-connection"):
            rate = int(args.connection_mbps * 1e6)
            print(f"per-connection {args.connection_mbps:g} MB/s, no uplink shaping")
            with HubServer(folder / "hub2", host=bed.state.bridge["ip"], connection_rate=rate) as hub:
                publish(hub.root, REPO, files)
                runs = regime(bed, hub, folder, nodes, args.repeat, args.distribution, args.threads)
            per_node = statistics.median(r["seconds"] for r in runs.get("per-node", [{"seconds": float("nan")}]))
            for distribution, rs in runs.items():
                secs = statistics.median(r["seconds"] for r in rs)
                name = f"{args.connection_mbps:g} MB/s per hub connection"
                table.append((name, distribution, secs, rs, f"per-node / this {per_node / secs:.2f}"))
        if args.regime == "straggler":
            shaped = args.uplink_mbit or None
            limit = size / (args.uplink_mbit * 1e6 / 8) if shaped else None
            where = f"uplink {args.uplink_mbit} Mbit/s" if shaped else "hub unshaped"
            print(f"straggler: {where}, node0 at {args.straggler_mbit} Mbit/s to each peer")
            with HubServer(folder / "hub3", host=bed.state.bridge["ip"]) as hub, uplink(shaped):
                publish(hub.root, REPO, files)
                runs = regime(bed, hub, folder, nodes, args.repeat, args.distribution, args.threads,
                              args.straggler_mbit)  # fmt: skip
            healthy = statistics.median(r["seconds"] for r in runs.get("stripe", [{"seconds": float("nan")}]))
            for name, rs in runs.items():
                secs = statistics.median(r["seconds"] for r in rs)
                ratio = f"{secs / healthy:.2f} × healthy stripe" + (f", {secs / limit:.2f} × limit" if limit else "")
                table.append((f"{where}, straggler", name, secs, rs, ratio))
    for t in nodes.values():
        t.run(f"rm -rf {ROOT}", 120)
        t.close()
    print("\n| regime | distribution | stage time, median (s) | runs (s) | hub served (GB) | from peers (GB) | ratio |")
    print("|---|---|---:|---|---:|---:|---|")
    for name, distribution, secs, rs, ratio in table:
        each = ", ".join(f"{r['seconds']:.1f}" for r in rs)
        hub_gb = statistics.median(r["hub_bytes"] for r in rs) / 1e9
        peers_gb = statistics.median(r["from_peers"] for r in rs) / 1e9
        print(f"| {name} | {distribution} | {secs:.1f} | {each} | {hub_gb:.2f} | {peers_gb:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
