"""The launch stage: start node 0 then the headless ranks as the plan shows them, wait until really ready.

Whatever happens after the first container starts, this run's containers are removed on failure
(in the flow), crash and cancellation (flow hooks); on success only when asked, since later stages
use the service.
"""

from dataclasses import asdict
from typing import Any

from prefect import flow, runtime
from prefect.logging import get_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.errors import LaunchStageFailed
from k3deploy.paths import run_folder
from k3deploy.stage import FailureCause, FailureClass, Finding, StageResult
from k3deploy.tasks.launch.steps import (
    LaunchFailed,
    LaunchRecord,
    remove_containers,
    remove_run_containers,
    start_containers,
    wait_until_ready,
)
from k3deploy.tasks.render import render_plan
from k3deploy.tasks.stage_run import StageRun

# The config each running launch resolved, for the crash hook (it runs in the same process).
_RUNNING: dict[str, DeploymentConfig] = {}


def teardown_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """On crash or cancellation: remove what this run started, on every node.

    A cancelled deployment run's hook runs in the runner's process, which knows only the
    parameters: the config is then resolved again from its path or block name.
    """
    logger = get_logger("k3deploy.launch")
    cfg = _RUNNING.pop(str(flow_run.id), None)
    source = flow_run.parameters.get("config")
    if cfg is None and isinstance(source, str):
        cfg = resolve_config(source)
    if cfg is None:
        logger.error("launch %s ended %s; its config is unknown here: run `k3deploy teardown`", flow_run.id, state.name)
        return
    try:
        removed = remove_run_containers(cfg, str(flow_run.id))
        logger.info("launch ended %s; removed %s", state.name, removed)
    except Exception:
        logger.exception("teardown after %s failed: containers of run %s may be left", state.name, flow_run.id)
        raise


@flow(name="launch", on_crashed=[teardown_hook], on_cancellation=[teardown_hook])
def launch(config: ConfigSource, teardown_after: bool = False) -> StageResult:
    """Serving on every node, ready for real requests on every DP rank, or failed naming node, rank and line."""
    cfg = resolve_config(config)
    run_id = str(runtime.flow_run.id)
    run = StageRun("launch", LaunchStageFailed)
    # Logs go to the run folder of the validate run this launch is part of (its own when run alone).
    logs = run_folder(str(runtime.flow_run.root_flow_run_id or run_id), "logs")
    plan = render_plan(cfg, run_id=run_id)  # the same renderer as `k3deploy plan`
    run.section("Commands", f"```sh\n{plan.to_text()}\n```")
    _RUNNING[run_id] = cfg
    record, error, done = LaunchRecord(run_id), None, False
    removed: dict[str, list[str]] = {}
    with run.guard():
        try:
            try:
                started = start_containers(cfg, plan)
                record = wait_until_ready(cfg, plan, started, run_id, logs)
            except LaunchFailed as err:
                record, error = err.record or record, err
            done = error is None
        finally:  # a failure (or an error before the monitor took over) leaves nothing of this config running:
            _RUNNING.pop(run_id, None)  # neither what this run started nor what it adopted from an earlier one
            if not done or teardown_after:
                removed = remove_containers(cfg, None)
                names = [f"{node}: {', '.join(gone)}" for node, gone in removed.items() if gone]
                run.note(f"removed {'; '.join(names) or 'nothing'}")
    run.data = asdict(record) | {"plan": plan.to_json(), "removed": removed}
    run.table("milestones", record.milestones, "start-up milestones per node")
    for node, lines in record.tails.items():
        run.section(f"{node} (log: `{record.log_files.get(node, '?')}`)", "```\n" + "\n".join(lines) + "\n```")
    if error is not None:
        where = f"{error.failure.node} (DP rank {error.failure.rank})" if error.failure else "the service"
        run.findings = [Finding(where, "ready", False, str(error))]
        cause = FailureCause(failure_class=FailureClass.ENGINE, evidence=str(error))
        if error.failure is not None:
            run.data["failed_rank"] = asdict(error.failure)
            lost = error.failure
            evidence = f"{lost.reason}: {lost.line}" if lost.line else lost.reason  # the cause, then the line
            cause = FailureCause(failure_class=FailureClass.ENGINE, evidence=evidence, node=lost.node,
                                 dp_rank=lost.rank)  # fmt: skip
        run.failed(str(error), cause=cause)
    ranks = cfg.serve.data_parallel_size
    return run.passed(f"ready in {record.time_to_ready_s} s, {ranks} DP ranks, {record.burst_requests} requests")
