"""The launch stage: start node 0 then the headless ranks as the plan shows them, wait until really ready.

Whatever happens after the first container starts, this run's containers are removed on failure
(in the flow), crash and cancellation (flow hooks); on success only when asked, since later stages
use the service.
"""

from dataclasses import asdict

from prefect import flow, runtime

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import LaunchStageFailed
from k3deploy.core.paths import run_folder
from k3deploy.core.stage import StageResult
from k3deploy.flows.run_abort import serving, teardown_on_abort
from k3deploy.tasks.launch.steps import (
    LaunchRecord,
    ServiceNotReady,
    check_engine_report,
    check_what_runs,
    start_containers,
    wait_until_ready,
)
from k3deploy.tasks.render import render_plan
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.teardown import remove_servers_task


@flow(name="launch", on_crashed=[teardown_on_abort], on_cancellation=[teardown_on_abort])
def launch(config: ConfigSource, teardown_after: bool = False) -> StageResult:
    """Serving on every node, ready for real requests on every DP rank, or failed naming node, rank and line."""
    cfg = resolve_config(config)
    run_id = str(runtime.flow_run.id)
    run = StageRun("launch", LaunchStageFailed)
    # Logs go to the run folder of the validate run this launch is part of (its own when run alone).
    logs = run_folder(str(runtime.flow_run.root_flow_run_id or run_id), "logs")
    plan = render_plan(cfg, run_id=run_id)  # the same renderer as `k3deploy plan`
    run.section("Commands", f"```sh\n{plan.to_text()}\n```")
    record, error, done = LaunchRecord(run_id), None, False
    removed: dict[str, list[str]] = {}
    with run.guard(), serving(run_id, cfg):
        try:
            try:
                started = start_containers(cfg, plan)
                live = check_what_runs(cfg, plan, started, run_id)  # each rank runs what the plan says
                record = wait_until_ready(cfg, plan, started, run_id, logs)
                record.live = live
                record.engine = check_engine_report(cfg, plan)  # and the engine says what the config asked
            except ServiceNotReady as err:
                record, error = err.record or record, err
            done = error is None
        finally:  # a failure (or an error before the monitor took over) leaves nothing of this config running,
            # neither what this run started nor what it adopted from an earlier one
            if not done or teardown_after:
                removed = remove_servers_task(cfg, None)
                names = [f"{node}: {', '.join(gone)}" for node, gone in removed.items() if gone]
                run.note(f"removed {'; '.join(names) or 'nothing'}")
    run.data = asdict(record) | {"plan": plan.to_json(), "removed": removed}
    run.table("milestones", record.milestones, "start-up milestones per node")
    run.table("running", record.live, "per rank: what runs, read back from the runtime, against the plan")
    for node, lines in record.tails.items():
        run.section(f"{node} (log: `{record.log_files.get(node, '?')}`)", "```\n" + "\n".join(lines) + "\n```")
    if error is not None:
        run.findings = [error.finding()]
        if error.failure is not None:
            run.data["failed_rank"] = asdict(error.failure)
        run.failed(str(error), cause=error.cause())
    ranks, kv = cfg.serve.data_parallel_size, record.engine.get("kv_tokens")
    return run.passed(f"ready in {record.time_to_ready_s} s, {ranks} DP ranks, {record.burst_requests} requests, "
                      f"KV cache {kv} tokens per rank")  # fmt: skip
