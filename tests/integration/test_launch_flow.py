"""Launch and teardown on the test bed: four Podman engines over SSH running the vLLM stand-in.

Faults go to one node only through the stand-in's control file, which sits in that host's private
model root (mounted into its container): the other nodes have no such file.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3deploy.blocks.source import resolve_config
from k3deploy.core.errors import LaunchStageFailed, TeardownFailed
from k3deploy.flows.launch import launch
from k3deploy.flows.teardown import teardown
from k3deploy.tasks.containers import RUN_LABEL, run_kwargs
from k3deploy.tasks.render import render_plan
from tests.bedconfig import write_config
from tests.launchbed import NAME, control, launch_config, launch_data, ours
from tests.prefect_runs import latest_artifact

pytestmark = [pytest.mark.launch, pytest.mark.testbed, pytest.mark.prefect, pytest.mark.usefixtures("runs_dir")]


def test_four_containers_start_in_order_become_ready_and_teardown_twice_is_harmless(
    prefect_server, testbed, bed_nodes, tmp_path
):
    config = launch_config(testbed, tmp_path)
    record = launch(config=config).data

    assert record["time_to_ready_s"] is not None and record["burst_requests"] == 16
    clients = bed_nodes["clients"]
    containers = {n: clients[n].containers.get(NAME) for n in clients}
    assert {c.labels[RUN_LABEL] for c in containers.values()} == {record["run_id"]}
    assert not any(c.attrs["HostConfig"]["Privileged"] for c in containers.values())  # never privileged
    started = [containers[n].attrs["State"]["StartedAt"] for n in ("node0", "node1", "node2", "node3")]
    assert started == sorted(started)  # node 0 first, then ranks 1..3
    seen = {(row["node"], row["milestone"]) for row in record["milestones"]}
    assert ("node0", "startup_complete") in seen and all((n, "kv_cache") in seen for n in containers)
    assert "Application startup complete." in Path(record["log_files"]["node0"]).read_text()
    # Read back through the Docker API (inspect: command, environment, image, devices), each rank is its plan.
    assert [(r["node"], r["dp rank"], r["how"], r["differs"]) for r in record["live"]] == [
        (f"node{i}", i, "started", "") for i in range(4)
    ]

    # Launching again with the same config adopts the running containers: never two servers per node.
    again = launch(config=config).data
    assert again["started"] == dict.fromkeys(containers, True)

    first = teardown(config=config)
    assert first.data["removed"] == {n: [NAME] for n in containers}
    assert teardown(config=config).data["removed"] == {n: [] for n in containers}
    assert not any(ours(bed_nodes).values())


def test_fatal_line_in_one_worker_fails_the_launch_naming_it_and_nothing_is_left(
    prefect_server, testbed, bed_nodes, tmp_path
):
    line = "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB"
    control(bed_nodes, "node2", K3SIM_FATAL_LINE=line, K3SIM_FATAL_AFTER_S=1, K3SIM_FATAL_KEEP_RUNNING=1)
    with pytest.raises(LaunchStageFailed) as failed:
        launch(config=launch_config(testbed, tmp_path, startup_s=600))  # it would never be ready
    failure = failed.value.result.data["failed_rank"]
    assert (failure["node"], failure["rank"]) == ("node2", 2)
    assert failure["line"] == line and failure["reason"].startswith("fatal log line npu_oom (")
    assert failure["emitted_at"] is not None and failure["seen_at"] >= failure["emitted_at"]
    summary = latest_artifact("launch-summary")  # the UI shows why, and node2's last lines, for a failure too
    assert "# launch: FAIL" in summary and "node2 (DP rank 2): fatal log line" in summary
    assert summary.count(line) >= 2
    assert not any(ours(bed_nodes).values())  # the failure hook removed all four


def test_worker_exiting_early_is_caught_whatever_its_exit_code(prefect_server, testbed, bed_nodes, tmp_path):
    control(bed_nodes, "node3", K3SIM_DIE_AFTER_S=1, K3SIM_DIE_EXIT_CODE=0)
    with pytest.raises(LaunchStageFailed) as failed:
        launch(config=launch_config(testbed, tmp_path, startup_s=600))
    assert str(failed.value).startswith(
        "launch failed: node3 (DP rank 3): the container exited (status 0) during launch"
    )
    assert not any(ours(bed_nodes).values())


@pytest.mark.faults
def test_a_failed_relaunch_removes_what_it_adopted_too_and_says_so(prefect_server, testbed, bed_nodes, tmp_path):
    """A rerun of launch adopts the three live servers, starts node3's anew, and that one dies: all four go."""
    config = launch_config(testbed, tmp_path)
    launch(config=config)
    bed_nodes["clients"]["node3"].containers.get(NAME).remove(force=True)  # node3's server is gone
    control(bed_nodes, "node3", K3SIM_DIE_AFTER_S=1, K3SIM_DIE_EXIT_CODE=1)
    with pytest.raises(LaunchStageFailed) as failed:
        launch(config=config)
    result = failed.value.result
    assert result.data["started"] == {"node0": True, "node1": True, "node2": True, "node3": False}
    assert result.data["removed"] == {n: [NAME] for n in ("node0", "node1", "node2", "node3")}
    assert "node3 (DP rank 3)" in result.reason
    assert not any(ours(bed_nodes).values())


@pytest.mark.faults
def test_a_rank_changed_behind_our_back_fails_launch_naming_node_rank_and_keys(
    prefect_server, testbed, bed_nodes, tmp_path
):
    """node1's server is replaced by hand with one of the same name and labels (so launch adopts it) but one
    flag and one environment variable changed: launch reads it back, names node, rank and both keys."""
    config = launch_config(testbed, tmp_path)
    launch(config=config)
    spec = render_plan(resolve_config(config)).nodes[1].container
    assert spec is not None
    kwargs = run_kwargs(spec)
    at = kwargs["command"].index("--max-num-seqs")
    kwargs["command"][at + 1] = "3"  # the plan says 16
    kwargs["environment"]["HCCL_BUFFSIZE"] = "1"  # the plan says the seed's 1024
    client = bed_nodes["clients"]["node1"]
    client.containers.get(NAME).remove(force=True)
    client.containers.run(**kwargs)

    with pytest.raises(LaunchStageFailed) as failed:
        launch(config=config)
    result = failed.value.result
    assert result.data["started"] == dict.fromkeys(("node0", "node1", "node2", "node3"), True)  # all adopted
    reason = result.reason
    assert "node1 (DP rank 1): runs what the plan does not say" in reason
    assert "flag --max-num-seqs: '3' running, the plan says '16'" in reason
    assert "env HCCL_BUFFSIZE: '1' running, the plan says '1024'" in reason
    assert [r["node"] for r in result.data["live"] if r["differs"]] == ["node1"]
    assert result.data["failed_rank"]["node"] == "node1" and result.data["failed_rank"]["rank"] == 1
    assert result.failure is not None and result.failure.failure_class.value == "infrastructure"
    assert not any(ours(bed_nodes).values())  # nothing of this config is left serving


def test_a_container_that_is_not_ours_is_refused_and_left_alone(prefect_server, testbed, bed_nodes, tmp_path):
    foreign = bed_nodes["clients"]["node1"].containers.run(
        testbed.image_ref_by_digest, ["sleep", "600"], name=NAME, detach=True, entrypoint=[]
    )
    with pytest.raises(
        Exception, match=r"node1: a container named vllm-kimi-k3 is already there \(running, not started"
    ):
        launch(config=launch_config(testbed, tmp_path))
    assert not any(ours(bed_nodes).values())  # node 0's, started first, was removed
    foreign.reload()
    assert foreign.status == "running"  # someone else's container is never touched


def test_a_crashed_launch_process_leaves_no_container(prefect_server, testbed, bed_nodes, tmp_path):
    """SIGTERM to the process running the flow (as a worker shutting down): the crash hook tears down."""
    from prefect.settings import PREFECT_API_URL

    config = launch_config(testbed, tmp_path, startup_s=600)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "K3DEPLOY_RUNS_DIR": str(tmp_path / "runs")}
    code = f"from k3deploy.flows.launch import launch; launch(config={config!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 120
        while sum(map(len, ours(bed_nodes).values())) < 4:  # polling the engines, not sleeping blind
            assert proc.poll() is None and time.monotonic() < deadline, "the launch never started all four"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not any(ours(bed_nodes).values())


def test_cancelling_a_launch_from_prefect_removes_its_containers(
    prefect_server, testbed, bed_nodes, tmp_path, monkeypatch
):
    """As from the UI: a Runner executes the deployment's run; setting it Cancelling kills it and runs the hook."""
    import asyncio
    import threading

    from prefect import get_client
    from prefect.deployments import run_deployment
    from prefect.runner import Runner
    from prefect.settings import PREFECT_API_URL
    from prefect.states import Cancelling

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())  # the runner's child process reports here
    runner = Runner(query_seconds=1)
    deployment = runner.add_flow(launch, name=f"cancel-{random.randrange(10**9)}")
    run = run_deployment(deployment, parameters={"config": launch_config(testbed, tmp_path, startup_s=600)}, timeout=0)
    worker = threading.Thread(target=lambda: asyncio.run(runner.start(run_once=True)), daemon=True)
    worker.start()
    deadline = time.monotonic() + 120
    while sum(map(len, ours(bed_nodes).values())) < 4:  # polling the engines until all four run
        assert worker.is_alive() and time.monotonic() < deadline, "the launch never started all four"
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run.id, Cancelling(), force=True)
        while not (state := client.read_flow_run(run.id).state).is_final():
            assert time.monotonic() < deadline + 120, f"still {state.name} after the cancel"
    worker.join(60)
    assert state.name == "Cancelled"
    assert not any(ours(bed_nodes).values())  # the on_cancellation hook removed all four


@pytest.mark.faults
def test_teardown_clears_every_node_it_trusts_and_names_the_one_whose_host_key_changed(
    prefect_server, testbed, bed_nodes, tmp_path
):
    """One node refusing (its host key changed) must not leave the others' servers running."""
    pinned = tmp_path / "known_hosts"
    pinned.write_text(Path(testbed.known_hosts).read_text())
    data = launch_data(testbed)
    data["cluster"]["ssh"]["known_hosts"] = str(pinned)
    config = write_config(tmp_path / "site.yaml", data)
    launch(config=config)
    lines = pinned.read_text().splitlines()
    node0, node2 = testbed.host("node0").ip, testbed.host("node2").ip
    other_key = next(line for line in lines if line.startswith(f"{node0} ")).split(" ", 1)[1]
    pinned.write_text("\n".join(f"{node2} {other_key}" if line.startswith(f"{node2} ") else line for line in lines))

    with pytest.raises(TeardownFailed) as failed:
        teardown(config=config)
    result = failed.value.result
    assert result.data["removed"] == {n: [NAME] for n in ("node0", "node1", "node3")}
    assert list(result.data["not_cleared"]) == ["node2"]
    assert "host key CHANGED" in result.data["not_cleared"]["node2"]
    assert "node2" in result.reason and "run teardown again" in result.reason
    assert ours(bed_nodes) == {"node0": [], "node1": [], "node2": [NAME], "node3": []}

    pinned.write_text(Path(testbed.known_hosts).read_text())  # the key is trusted again: a later teardown
    assert teardown(config=config).data["removed"] == {"node0": [], "node1": [], "node2": [NAME], "node3": []}
    assert not any(ours(bed_nodes).values())
