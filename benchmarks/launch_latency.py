"""Launch: how soon a fatal log line fails the flow, and how soon readiness is seen, on the test bed.

    python -m benchmarks.launch_latency [--trials 3]

Needs a running bed (`python -m testbed up --hosts 4`). Runs the real `launch` flow against four
stand-in containers under a temporary Prefect server. Prints Markdown tables.

* Fatal: node 2 prints `NPU out of memory` 2 s after start and keeps running (so only the log line
  can fail the launch); latency = when the flow raised minus the line's engine timestamp.
* Ready: node 0 becomes ready after K3SIM_STARTUP_S; lag = when launch called it ready minus when
  this machine saw `Application startup complete.`, for several poll intervals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from k3deploy.blocks.serve import SEED_ENV
from k3deploy.tasks.transport import SSHTransport
from testbed.layout import load_state, resolve_state_file
from testbed.pytest_plugin import Testbed
from tests.bedconfig import bed_config, write_config

CONTROL = "/srv/models/k3sim-control.json"
READY_TIMEOUT_S = 7500


def config(bed: Testbed, folder: Path, startup_s: float, poll_s: float) -> str:
    repository = bed.image_ref_by_digest.split("@")[0]
    data = bed_config(bed, image__ref=f"{repository}:1", image__digest=bed.image_digest)
    data["serve"]["env"] = {
        **SEED_ENV,
        "K3SIM_CHECK_MODEL": "0",
        "K3SIM_STARTUP_S": str(startup_s),
        "K3SIM_CONTROL_FILE": CONTROL,
    }
    data["serve"]["readiness"] = {"timeout_s": READY_TIMEOUT_S, "poll_s": poll_s, "request_timeout_s": 10}
    return write_config(folder / f"b-{time.monotonic_ns()}.yaml", data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from k3deploy.flows.launch import launch
    from k3deploy.tasks.launch.steps import ServiceNotReady

    bed = Testbed.from_state(load_state(resolve_state_file(None)))
    node2 = SSHTransport(bed.hosts[2].ip, name="node2", private_key_file=bed.key, known_hosts=bed.known_hosts)
    folder = Path(tempfile.mkdtemp(prefix="k3-launch-bench-"))
    os.environ["K3DEPLOY_RUNS_DIR"] = str(folder / "runs")
    quiet = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None, PREFECT_SERVER_ANALYTICS_ENABLED: False}
    fatal_rows, ready_rows = [], []
    with temporary_settings(quiet), prefect_test_harness(server_startup_timeout=120):
        line = "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB"
        settings = {"K3SIM_FATAL_LINE": line, "K3SIM_FATAL_AFTER_S": "2", "K3SIM_FATAL_KEEP_RUNNING": "1"}
        node2.run(f"printf %s {shlex.quote(json.dumps(settings))} > {CONTROL}", 30).check()
        try:
            for _ in range(args.trials):
                try:
                    launch(config=config(bed, folder, startup_s=600, poll_s=5))
                    raise SystemExit("the launch did not fail on the fatal line")
                except ServiceNotReady as err:
                    raised = time.time()
                    failure = err.failure
                    assert failure is not None and failure.emitted_at is not None and failure.node == "node2"
                    fatal_rows.append((failure.seen_at - failure.emitted_at, raised - failure.emitted_at))
        finally:
            node2.run(f"rm -f {CONTROL}", 30)
        for poll_s in (0.5, 2.0, 5.0):
            lags = []
            for _ in range(args.trials):
                record = launch(config=config(bed, folder, startup_s=4, poll_s=poll_s), teardown_after=True)
                complete = next(r["seconds"] for r in record["milestones"] if r["milestone"] == "startup_complete")
                lags.append(record["time_to_ready_s"] - complete)
            ready_rows.append((poll_s, lags))
    node2.close()

    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}; "
        f"4 bed hosts; `python -m benchmarks.launch_latency --trials {args.trials}`\n"
    )
    print("| fatal line → | median s | max s | max / ready timeout |")
    print("|---|---:|---:|---:|")
    for label, values in (
        ("seen by the log follower", [r[0] for r in fatal_rows]),
        ("launch flow failed", [r[1] for r in fatal_rows]),
    ):
        print(
            f"| {label} | {statistics.median(values):.2f} | {max(values):.2f} | {max(values) / READY_TIMEOUT_S:.1e} |"
        )
    print("\n| readiness poll interval s | median lag s | max lag s | max lag / poll interval |")
    print("|---:|---:|---:|---:|")
    for poll_s, lags in ready_rows:
        print(f"| {poll_s:g} | {statistics.median(lags):.2f} | {max(lags):.2f} | {max(lags) / poll_s:.2f} |")
    with contextlib.suppress(OSError):
        for f in folder.glob("*.yaml"):
            f.unlink()


if __name__ == "__main__":
    main()
