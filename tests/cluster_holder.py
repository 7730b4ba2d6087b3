"""A run that holds a cluster until it is killed: `python -m tests.cluster_holder CONFIG LIMIT_S`.

Its own process and flow run, as a worker's flow run is, so a test can SIGKILL it while it holds the
cluster (no hook, no `finally` runs) and watch what the next run does about the hold it leaves.
"""

from __future__ import annotations

import sys
import time

from prefect import flow, runtime

from k3deploy.blocks.loader import load_config
from k3deploy.flows.cluster_lock import hold_cluster


@flow(name="hold-cluster")
def hold(config: str, limit_s: float) -> None:
    with hold_cluster(load_config(config).cluster, runtime.flow_run.id, runtime.flow_run.name):
        deadline = time.monotonic() + limit_s  # bounded: a test that forgets it cannot leave it for ever
        while time.monotonic() < deadline:
            time.sleep(0.5)


if __name__ == "__main__":
    hold(sys.argv[1], float(sys.argv[2]))
