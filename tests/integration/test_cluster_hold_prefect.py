"""A run that dies holding a cluster never blocks it: on the suite's temporary Prefect server, which runs no
lease repossessor (so its lease would never lapse), the next run finds the hold dead and takes it over;
`k3deploy cluster status` and `cluster release` show and clear a hold.

The run that dies is a real flow run in a process of its own (tests/cluster_holder.py), SIGKILLed while
it holds the cluster, as a worker's run dies with its worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID, uuid4

import pytest
import yaml
from prefect import flow, get_client, runtime
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed

from k3deploy.blocks.loader import load_config
from k3deploy.flows.cluster_hold import STALE_BEATS, same_hold, takeover_bound_s
from k3deploy.flows.cluster_lock import cluster_hold, hold_cluster, lock_name, read_hold
from tests.prefect_runs import flow_run, logged, wait_for

# anywhere: a cluster name of each test's own, no port, no vLLM (the local profile only names its nodes)
pytestmark = [pytest.mark.prefect, pytest.mark.faults, pytest.mark.anywhere]
ROOT = Path(__file__).parents[2]
BEAT_S = 2.0  # cluster.hold_beat_s here: a dead holder is found in 4 beats (8 s), not the default's 60 s


def cluster_config(tmp_path: Path, beat_s: float | None = None) -> str:
    """The local profile on a cluster name of this test's own (no other test shares its lock)."""
    data = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    data["cluster"] |= {"name": f"hold-{uuid4().hex[:8]}", "model_root": str(tmp_path / "models")}
    if beat_s is not None:
        data["cluster"]["hold_beat_s"] = beat_s
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@contextlib.contextmanager
def holding_run(config: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A flow run in its own process that holds the cluster (up to 10 minutes); killed on the way out."""
    env = os.environ | {"PREFECT_API_URL": str(PREFECT_API_URL.value()), "DO_NOT_TRACK": "1"}
    with (tmp_path / "holder.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster_holder", config, "600"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        name = lock_name(load_config(config).cluster)
        wait_for("the holder to hold the cluster", lambda: read_hold(name), timeout=180)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


def kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # no finally, no hook: the hold stays recorded and leased
    proc.wait(timeout=60)


@flow(name="take-cluster")
def take(config: str) -> str:
    """The next run: waits for the cluster (at most busy_timeout_s), holds it, says who it was."""
    with hold_cluster(load_config(config).cluster, runtime.flow_run.id, runtime.flow_run.name):
        record = read_hold(lock_name(load_config(config).cluster))
        return record.run_id if record else ""


def with_busy_timeout(config: str, seconds: float) -> str:
    data = yaml.safe_load(Path(config).read_text())
    data["cluster"]["busy_timeout_s"] = seconds
    Path(config).write_text(yaml.safe_dump(data))
    return config


def test_a_run_killed_holding_the_cluster_is_taken_over_within_the_bound_naming_it(prefect_server, tmp_path):
    config = with_busy_timeout(cluster_config(tmp_path, BEAT_S), takeover_bound_s(BEAT_S) + 120)  # a bounded wait
    name = lock_name(load_config(config).cluster)
    with holding_run(config, tmp_path) as proc:
        # While it lives it renews its lease and its record (a renewal that failed would not count the beat).
        dead = wait_for("the holder to renew", lambda: (r := read_hold(name)) and r.beat >= 1 and r, timeout=120)
        assert dead.lease_id and dead.run_id and dead.beat_s == BEAT_S
        kill(proc)
    assert flow_run(UUID(dead.run_id)).state.type.value == "RUNNING"  # Prefect does not know it died
    assert cluster_hold(load_config(config).cluster).active_slots == 1  # and its lease stays taken

    started = time.monotonic()
    state = take(config, return_state=True)
    waited = time.monotonic() - started
    assert state.is_completed(), state
    new_run = state.state_details.flow_run_id
    assert state.result() == str(new_run)  # it held the cluster itself
    said = logged(new_run, "taking over the hold of")
    assert f"run {dead.run_name} ({dead.run_id})" in said and "its hold was not renewed for" in said
    assert logged(new_run, "waiting for it")
    # The stated bound (from the first look at the hold), with room for a loaded machine's slow requests.
    assert STALE_BEATS * BEAT_S <= waited < takeover_bound_s(BEAT_S) + 30, waited
    hold = cluster_hold(load_config(config).cluster)
    assert (hold.active_slots, hold.record) == (0, None)  # released on the way out, the dead lease gone too


def test_a_holder_whose_flow_run_ended_is_taken_over_at_once(prefect_server, tmp_path):
    config = with_busy_timeout(cluster_config(tmp_path), 30)  # not the 60 s a stale record would take
    name = lock_name(load_config(config).cluster)
    with holding_run(config, tmp_path) as proc:
        dead = read_hold(name)
        assert dead is not None and dead.run_id
        kill(proc)
    with get_client(sync_client=True) as client:  # as a worker marks the run of a process that died
        client.set_flow_run_state(UUID(dead.run_id), Crashed(message="process exited"), force=True)
    state = take(config, return_state=True)
    assert state.is_completed(), state
    said = logged(state.state_details.flow_run_id, "taking over the hold of")
    assert f"({dead.run_id})" in said and "its flow run is Crashed" in said


def k3deploy(*args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PREFECT_API_URL": str(PREFECT_API_URL.value()), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "k3deploy", *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )


@pytest.mark.cli
def test_cluster_status_and_release_through_the_cli(prefect_server, tmp_path):
    config = cluster_config(tmp_path)
    name = lock_name(load_config(config).cluster)
    label = load_config(config).cluster.name
    free = k3deploy("cluster", "status", "-c", config)
    assert free.returncode == 0 and f"cluster {label}: free" in free.stdout, free.stderr

    with holding_run(config, tmp_path) as proc:
        record = read_hold(name)
        assert record is not None
        status = k3deploy("cluster", "status", "-c", config)
        assert status.returncode == 0, status.stderr
        assert f"held by run {record.run_name} ({record.run_id})" in status.stdout and "Running" in status.stdout
        assert "alive" in status.stdout and "Traceback" not in status.stderr

        refused = k3deploy("cluster", "release", "-c", config)
        assert refused.returncode == 1 and "which is alive" in refused.stderr and "--force" in refused.stderr
        assert refused.stderr.startswith("k3deploy: error: ") and "Traceback" not in refused.stderr
        assert same_hold(read_hold(name), record)  # untouched (its holder's beat may have renewed it since)
        kill(proc)

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(UUID(record.run_id or ""), Crashed(message="worker died"), force=True)
    stale = k3deploy("cluster", "status", "-c", config, "--format", "json")
    assert stale.returncode == 0, stale.stderr
    assert '"stale": "its flow run is Crashed"' in stale.stdout
    released = k3deploy("cluster", "release", "-c", config)
    assert released.returncode == 0, released.stderr
    assert f"released cluster {label}, held by run {record.run_name}" in released.stdout
    assert "its flow run is Crashed" in released.stdout
    hold = cluster_hold(load_config(config).cluster)
    assert (hold.active_slots, hold.record) == (0, None)

    with holding_run(config, tmp_path) as proc:  # --force frees a live holder's hold
        forced = k3deploy("cluster", "release", "-c", config, "--force")
        assert forced.returncode == 0 and "forced (--force)" in forced.stdout, forced.stderr
        assert k3deploy("cluster", "status", "-c", config).stdout.strip().endswith(f"free ({name})")
    again = k3deploy("cluster", "release", "-c", config)
    assert again.returncode == 0 and "nothing to release" in again.stdout
