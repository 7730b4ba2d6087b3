"""What watching a container for its exit costs the node's container engine: the engine's wait endpoint (what
docker-py's `api.wait` calls) against reading the container's state every second (`DockerRuntime.wait_exit`).

On a bed host (Podman's API service behind the Docker API, over the pinned SSH connection), a container that
prints a line a second is watched each way for a window; the engine service's CPU seconds over that window are
read from /proc, next to the idle service's and a log follow's (launch follows every rank's log as well).

Run from the repository root with the bed up: `python3 -m benchmarks.exit_watch [--seconds 10]`.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from k3deploy.tasks.runtime import DockerRuntime
from k3deploy.tasks.transport.docker_api import docker_client
from testbed.pytest_plugin import Testbed, load_state, resolve_state_file
from tests.bedconfig import bed_transports

NODE = "node0"
IMAGE = "10.213.0.1:5000/k3deploy/testimg:1"


def engine_cpu_s(node: str) -> float:
    """CPU seconds (user + system) the node's `podman system service` has used so far."""
    pids = subprocess.run(["pgrep", "-f", f"hosts/{node}/podman.sock"], capture_output=True, text=True).stdout.split()
    fields = Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in clock ticks (100 Hz)


def measured(seconds: float, watch: Callable[[threading.Event], Any] | None) -> float:
    """Engine CPU seconds over `seconds` while `watch` runs in a thread (stopped after the window)."""
    stop = threading.Event()
    thread = threading.Thread(target=watch, args=(stop,), daemon=True) if watch else None
    before = engine_cpu_s(NODE)
    if thread:
        thread.start()
    time.sleep(seconds)  # the window itself is what is measured
    spent = engine_cpu_s(NODE) - before
    stop.set()
    if thread:
        thread.join(30)  # each watcher gone before the next window
    return spent


def engine_wait(client: Any, container_id: str, seconds: float) -> None:
    """The engine's wait endpoint, given up when the window ends (a read timeout: the container still runs)."""
    with contextlib.suppress(requests.exceptions.RequestException, OSError):  # the read timeout
        client.api.wait(container_id, timeout=seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measuring window")
    args = parser.parse_args()
    bed = Testbed.from_state(load_state(resolve_state_file()))
    client = docker_client(bed_transports(bed, 1)[NODE])
    client.images.pull(IMAGE)
    container = client.containers.run(IMAGE, ["sh", "-c", "while true; do echo line; sleep 1; done"], detach=True)
    runtime = DockerRuntime(NODE, client)
    try:
        rows = {
            "idle (nothing watching)": measured(args.seconds, None),
            "log follow (api.logs, follow)": measured(
                args.seconds, lambda stop: [None for _ in runtime.log_chunks(container.id, stop) if stop.is_set()]
            ),
            "engine wait endpoint (api.wait)": measured(
                args.seconds, lambda stop: engine_wait(client, container.id, args.seconds)
            ),
            "state read every 1 s (DockerRuntime.wait_exit)": measured(
                args.seconds, lambda stop: runtime.wait_exit(container.id, stop)
            ),
        }
    finally:
        container.remove(force=True)
    print(f"engine CPU seconds over {args.seconds:g} s windows, one watcher each, on {NODE}:")
    for name, spent in rows.items():
        print(f"  {name:48} {spent:6.2f} s  ({spent / args.seconds:.0%} of a core)")


if __name__ == "__main__":
    main()
