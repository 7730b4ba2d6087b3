"""Prefect-native operations against a real Prefect server: deployments executed by a real process
worker, one run per cluster (enqueued or refused), the UI's parameter form, and the Retry of a failed
validate run that does not execute again the stages that passed.

The server is the session's temporary Prefect server; the worker is `prefect worker start` in its own
process, running each flow run in a process of its own, as in production. The serving side is the
stand-in profile (tests/standin_profile.py): the real hub client, the real vLLM environment's tools,
the stand-in for `vllm serve`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid4, uuid5

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.states import Cancelling
from prefect.variables import Variable

from k3deploy.blocks.loader import load_config
from k3deploy.cli.rerun import retry
from k3deploy.core.paths import runs_dir
from k3deploy.deployments.definitions import apply
from k3deploy.flows.cluster_lock import lock_name
from k3deploy.flows.teardown import teardown
from k3deploy.flows.validate import validate
from k3deploy.records.record import read_record
from tests.bedconfig import write_config
from tests.ports import port_free
from tests.prefect_runs import finished, flow_run, logged, wait_for
from tests.prefect_worker import processes_of, restart_worker
from tests.standin_profile import PORT, bench_runs_left, nothing_serving, standin_profile
from tests.vllm_env import needs_vllm_env

pytestmark = [pytest.mark.standin, pytest.mark.prefect, pytest.mark.vllm, needs_vllm_env,
              pytest.mark.usefixtures("runs_dir")]  # fmt: skip
CLUSTER = "ops-{}"  # this test's configs share one lock (standin_profile gives every other its own)


def children(run_id: UUID) -> list[FlowRun]:
    """The stage subflow runs of a validate run."""
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id]))
        )


def task_runs(run_id: UUID) -> list[tuple[str, str]]:
    """(task run name, state name) of a flow run, oldest first."""
    from prefect.client.schemas.filters import FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    return [(r.name, r.state.name) for r in sorted(runs, key=lambda r: r.expected_start_time)]


def gated_standin(tmp_path: Path, **cluster: Any) -> str:
    """The stand-in profile whose servers do not finish starting until open_gate(tmp_path): a run holds the
    cluster until the test has seen what it waits for, however fast or slow the machine is."""
    folder = tmp_path / str(cluster.get("on_busy", "enqueue"))
    data = standin_profile(folder)
    data["cluster"] |= {"name": CLUSTER.format(uuid5(NAMESPACE_URL, str(tmp_path)).hex[:8])} | cluster
    data["serve"]["readiness"]["timeout_s"] = 900
    data["serve"]["env"]["K3SIM_CONTROL_FILE"] = str(tmp_path / "gate.json")
    if not (tmp_path / "gate.json").exists():
        (tmp_path / "gate.json").write_text(json.dumps({"K3SIM_STARTUP_S": 3600}))  # re-read while starting
    return write_config(folder / "site.yaml", data)


def open_gate(tmp_path: Path) -> None:
    (tmp_path / "gate.json").write_text(json.dumps({"K3SIM_STARTUP_S": 0.5}))


def slow_bench(tmp_path: Path, **cluster: Any) -> str:
    """The stand-in profile whose answers take 0.2 s a token: its bench runs over half a minute."""
    data = standin_profile(tmp_path)
    data["serve"]["env"]["K3SIM_TOKEN_S"] = "0.2"
    data["cluster"] |= cluster
    return write_config(tmp_path / "site.yaml", data)


def benching_run(worker: str, tmp_path: Path, **cluster: Any) -> tuple[str, FlowRun]:
    """slow_bench deployed on the worker, and a validate run of launch and bench, returned once it benches."""
    config = slow_bench(tmp_path, **cluster)
    apply(config, worker)
    run = run_deployment("validate/validate", parameters={"only": ["launch", "bench"]}, timeout=0)
    wait_for("bench to run", lambda: bench_runs_left(tmp_path))
    return config, run


def hold_requests(tmp_path: Path, hold: bool) -> None:
    """The stand-in answers no request while held (K3SIM_HANG, read from its control file as it serves)."""
    (tmp_path / "control.json").write_text(json.dumps({"K3SIM_HANG": int(hold)}))


def cancel(run_id: UUID) -> None:
    """As the UI's Cancel does: the run goes Cancelling; its worker kills it and runs its hooks."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Cancelling(), force=True)


def holder(config: str) -> str | None:
    value = Variable.get(lock_name(load_config(config).cluster), default=None)
    return value.get("run_id") if isinstance(value, dict) else None


def test_a_worker_runs_deployed_validate_and_a_second_run_on_the_cluster_waits_its_turn(worker, tmp_path):
    config = gated_standin(tmp_path)
    deployed = apply(config, worker)
    assert {"nightly", "validate", "soak", "stage-models", "stage-launch", "stage-capacity", "bisect", "tune",
            "teardown"} <= set(deployed)  # fmt: skip
    first = run_deployment("validate/validate", parameters={"only": ["launch"]}, timeout=0)
    wait_for("the first run to hold the cluster", lambda: holder(config) == str(first.id))
    second = run_deployment("validate/validate", parameters={"only": ["launch"]}, timeout=0)
    # The first run cannot end before the gate opens, so the second finds the cluster held, and says so.
    said = logged(second.id, "waiting for it", timeout=300)
    assert f"({first.id})" in said
    assert children(second.id) == [] and holder(config) == str(first.id)
    open_gate(tmp_path)
    a, b = finished(first.id, timeout=600), finished(second.id, timeout=600)
    assert (a.state.type, b.state.type) == (StateType.COMPLETED, StateType.COMPLETED), (a.state, b.state)
    b_stages = children(second.id)
    # The hold ends with the first run's last stage (its report and alert come after, outside it).
    a_released = max(r.end_time for r in children(first.id))
    assert {r.name for r in b_stages} and all(r.start_time >= a_released for r in b_stages)  # only after a's
    assert {c.flow_id for c in children(first.id)} == {c.flow_id for c in b_stages}  # preflight, launch, teardown
    assert read_record(str(second.id)).verdict == "pass"
    assert port_free(PORT)


def test_a_run_told_to_refuse_a_busy_cluster_fails_naming_the_run_that_holds_it(worker, tmp_path):
    holds = gated_standin(tmp_path)
    refuses = gated_standin(tmp_path, on_busy="refuse")
    apply(holds, worker)
    first = run_deployment("validate/validate", parameters={"only": ["launch"]}, timeout=0)
    wait_for("the first run to hold the cluster", lambda: holder(holds) == str(first.id))
    second = run_deployment("validate/validate", parameters={"config": refuses, "only": ["launch"]}, timeout=0)
    b = finished(second.id)
    assert b.state.type is StateType.FAILED
    assert f"in use by run {flow_run(first.id).name} ({first.id})" in b.state.message
    assert "cluster.on_busy: refuse" in b.state.message
    assert children(second.id) == []  # it touched nothing
    open_gate(tmp_path)
    assert finished(first.id, timeout=600).state.type is StateType.COMPLETED


@pytest.mark.faults
def test_a_validate_run_cancelled_during_bench_leaves_nothing_running(worker, tmp_path):
    """Cancelled from the UI (state Cancelling): the worker kills the run, its hook tears the service down."""
    _config, run = benching_run(worker, tmp_path)
    cancel(run.id)
    assert finished(run.id).state.type is StateType.CANCELLED
    wait_for("the servers to be removed", lambda: nothing_serving(tmp_path))
    wait_for("the bench tool to end with its server", lambda: not bench_runs_left(tmp_path))
    assert processes_of(run.id) == []

    again = run_deployment("validate/validate", parameters={"only": ["launch"]}, timeout=0)  # the cluster is free
    assert finished(again.id).state.type is StateType.COMPLETED
    assert nothing_serving(tmp_path)


@pytest.mark.faults
def test_cancelling_a_run_queued_for_the_cluster_leaves_the_holders_service_alone(worker, tmp_path):
    """Its hook tears down only what a run that got the cluster served: a queued run served nothing."""
    _config, first = benching_run(worker, tmp_path)
    hold_requests(tmp_path, True)  # the first run's bench cannot end until the test says so
    second = run_deployment("validate/validate", parameters={"only": ["launch"]}, timeout=0)
    logged(second.id, "waiting for it", timeout=300)  # it found the cluster held
    cancel(second.id)
    assert finished(second.id).state.type is StateType.CANCELLED
    assert children(second.id) == []
    assert bench_runs_left(tmp_path) and not nothing_serving(tmp_path)  # the first run's service untouched
    # released, and at full speed (the control file wins over the slow token time the config set): what is
    # shown is that its bench goes through, not how long 0.2 s a token takes
    (tmp_path / "control.json").write_text(json.dumps({"K3SIM_HANG": 0, "K3SIM_TOKEN_S": 0}))
    assert finished(first.id).state.type is StateType.COMPLETED  # and its bench went through
    assert nothing_serving(tmp_path)


@pytest.mark.faults
@pytest.mark.bench
def test_a_soak_cancelled_from_the_ui_keeps_its_windows_and_its_retry_runs_only_what_is_left(worker, tmp_path):
    """Cancelled once two windows are judged: the worker kills the run and its hook tears the service down; the
    judged windows stay in the run's folder. The Retry of the same run (from the pool, by the worker) takes them
    over, marked resumed in its record, and runs only the minutes left."""
    data = standin_profile(tmp_path)
    data["soak"] = {"minutes": 0.01, "window_prompts": 8, "concurrency": 2,  # at least 4 windows (drift's 2 + 2)
                    "drift": {"windows": 2, "latency": 3.0, "throughput": 0.9}}  # fmt: skip
    config = write_config(tmp_path / "site.yaml", data)
    apply(config, worker)
    run = run_deployment("validate/validate", parameters={"only": ["launch", "soak"], "stages": {"soak": True}},
                         timeout=0)  # fmt: skip

    def judged() -> list[Path]:  # each window's memory reading: written once the window is judged
        return sorted(runs_dir().glob(f"{run.id}/soak/*/random-c2*.memory.json"))

    wait_for("two soak windows to be judged", lambda: len(judged()) >= 2)
    hold_requests(tmp_path, True)  # the window under way cannot end now: at most 3 of the 4 are judged at the cancel
    cancel(run.id)
    assert finished(run.id).state.type is StateType.CANCELLED
    wait_for("the servers to be removed", lambda: nothing_serving(tmp_path))
    kept = len(judged())
    assert 2 <= kept <= 3
    hold_requests(tmp_path, False)

    restart_worker(worker, tmp_path)  # no cancellation of the first attempt left pending on the worker
    again = retry(str(run.id))  # a deployment's run goes back to its pool: the worker runs it again
    assert again.is_completed(), again
    record = read_record(str(run.id))
    windows = record.stage("soak").data["windows"]  # type: ignore[union-attr]
    assert [w["resumed"] for w in windows[:kept]] == [True] * kept and not any(w["resumed"] for w in windows[kept:])
    assert [w["index"] for w in windows] == list(range(1, len(windows) + 1))
    assert record.soak is not None and record.soak.resumed_windows == kept and len(windows) == 4
    assert nothing_serving(tmp_path)


@pytest.mark.faults
def test_a_worker_killed_mid_run_leaves_servers_that_the_standalone_teardown_clears(worker, tmp_path):
    """The worker and the run it executes die at once (SIGKILL: no hook can run); the servers they started
    (sessions of their own) live on, and `teardown` on its own finds and removes them.

    Nobody releases the dead run's hold; the next run on the cluster takes it over
    (test_cluster_hold_prefect.py shows that)."""
    config, run = benching_run(worker, tmp_path)
    os.killpg(int((tmp_path / "worker.pid").read_text()), signal.SIGKILL)
    for pid in processes_of(run.id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    wait_for("the run's processes to be gone", lambda: not processes_of(run.id))
    assert not nothing_serving(tmp_path)  # left running: nobody tore them down

    result = teardown(config=config)
    assert {n: names for n, names in result.data["removed"].items()} == {
        "local0": ["vllm-kimi-k3-local0"],
        "local1": ["vllm-kimi-k3-local1"],
    }
    assert nothing_serving(tmp_path)
    wait_for("the bench tool to end with its server", lambda: not bench_runs_left(tmp_path))
    assert holder(config) == str(run.id)  # nobody released it


def test_the_validate_form_has_enums_descriptions_and_no_secret(prefect_server, tmp_path):
    pool = f"k3d-test-{uuid4().hex[:6]}"
    apply(gated_standin(tmp_path), pool)
    with get_client(sync_client=True) as client:
        schema = client.read_deployment_by_name("validate/validate").parameter_openapi_schema
    props, defs = schema["properties"], schema["definitions"]
    assert all(p.get("description") for p in props.values()), [k for k, p in props.items() if not p.get("description")]
    assert defs["StageName"]["enum"] == [
        "preflight",
        "models",
        "comm",
        "image",
        "launch",
        "smoke",
        "conformance",
        "bench",
        "capacity",
        "soak",
        "accuracy",
    ]
    assert {"as configured", "none", "Inferact/Kimi-K3-DSpark"} <= set(defs["DraftChoice"]["enum"])
    bench = defs["BenchOptions"]["properties"]
    assert {"workloads", "concurrency_sweep", "baseline_run"} == set(bench) and all(
        b["description"] for b in bench.values()
    )
    assert "cold only (random)" in defs["BenchWorkloads"]["enum"]
    stage_options = defs["StageOptions"]["properties"]  # the registry's model, one group of the form
    assert {"download", "full_verify", "fresh", "capacity", "soak", "soak_restart"} == set(stage_options) and all(
        o["description"] for o in stage_options.values()
    )
    assert props["config"]["type"] == "string"  # a block's name or a path: never the config (and its secrets)
    text = json.dumps(schema).lower()
    for secret in ("private_key", "token", "password", "secret", "writeonly"):
        assert secret not in text
    # tune's form: the matrix as a group of described fields, the workloads a dropdown, no secret
    with get_client(sync_client=True) as client:
        tune = client.read_deployment_by_name("tune/tune").parameter_openapi_schema
    assert set(tune["properties"]) == {"config", "matrix", "resume"} and "matrix" in tune["required"]
    assert all(p.get("description") for p in tune["properties"].values())
    matrix = tune["definitions"]["TuneMatrix"]["properties"]
    assert {"axes", "cells", "workloads", "concurrency", "bench", "smoke", "accuracy", "reference"} == set(matrix)
    assert all(m.get("description") for m in matrix.values())
    assert "cold only (random)" in tune["definitions"]["BenchWorkloads"]["enum"]
    said = json.dumps(tune).lower()  # (the matrix's help mentions num_speculative_tokens: not a secret)
    assert not any(secret in said for secret in ("private_key", "hub_token", "password", "secret", "writeonly"))


def test_retry_of_a_failed_run_skips_the_stages_that_passed_unless_their_inputs_changed(prefect_server, tmp_path):
    data = standin_profile(tmp_path, hub=True)
    data["bench"]["extra_args"] = ["--no-such-flag"]  # the late fault: the real `vllm bench serve` refuses it
    path = tmp_path / "site.yaml"
    config = write_config(path, data)
    only = ["models", "image", "launch", "smoke", "bench"]
    state = validate(config=config, only=only, return_state=True)
    run_id = state.state_details.flow_run_id
    assert state.is_failed() and read_record(str(run_id)).failed_stage == "bench"

    data["bench"]["extra_args"] = []  # the fault cleared; the same flow run again, as the UI's Retry
    write_config(path, data)
    again = retry(str(run_id))
    assert again.is_completed(), again
    assert flow_run(run_id).run_count == 2
    stages = [r.name for r in children(run_id)]
    flows = _flow_names(children(run_id))
    assert flows.count("models") == 1 and flows.count("image") == 1  # passed the first time: not again
    assert flows.count("launch") == 2 and flows.count("bench") == 2 and stages
    cached = [name for name, st in task_runs(run_id) if st == "Cached"]
    assert sorted(cached) == ["image", "models"]
    retried = read_record(str(run_id))
    nodes = len(retried.config["cluster"]["nodes"])
    for stage in retried.stages:  # the cluster time counted: wall time × nodes, and what a reuse saved
        if stage.stage in ("models", "image"):
            assert stage.saved_node_seconds == round(stage.seconds * nodes, 1) > 0, stage
        else:
            assert stage.saved_node_seconds == 0 and stage.node_seconds + 0.1 >= stage.seconds * nodes, stage
    assert retried.cluster_hours == round(sum(s.node_seconds for s in retried.stages) / 3600, 4) > 0
    assert retried.saved_cluster_hours == round(sum(s.saved_node_seconds for s in retried.stages) / 3600, 4) > 0

    commit = next(c.commit for c in read_record(str(run_id)).checkpoints if c.role == "target")
    data["models"]["target"]["revision"] = commit  # a changed checkpoint revision: models' inputs changed
    write_config(path, data)
    third = retry(str(run_id))
    assert third.is_completed(), third
    flows = _flow_names(children(run_id))
    assert flows.count("models") == 2 and flows.count("image") == 1
    assert read_record(str(run_id)).verdict == "pass"
    teardown(config=config)


def _flow_names(runs: list[FlowRun]) -> list[str]:
    with get_client(sync_client=True) as client:
        return [client.read_flow(r.flow_id).name for r in runs]
