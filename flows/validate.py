"""`validate`: the stages in sequence as subflows (one attempt of the campaign engine, flows/campaign.py),
teardown at the end, one run record and its report.

The top-level run holds the cluster (one run per cluster at a time). Stages run one after another
(concurrent subflows can pick up each other's results on a retry, Prefect issue #22259). Cached
stages (models, comm, image) run inside a task whose result persists once they passed, keyed by
the run and the config sections they read: the UI's Retry of a failed run (the same flow run), or
`k3deploy rerun RUN_ID`, does not execute them again unless those inputs changed; preflight,
launch and what follows always run. A run cancelled or crashed mid-way tears the service down
from its hooks (in the process that killed it).
"""

from contextlib import nullcontext
from enum import StrEnum
from typing import Any

from prefect import flow, runtime
from prefect.logging import get_run_logger
from prefect.settings import PREFECT_UI_URL

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.source import resolve_config
from k3deploy.core.errors import ValidateFailed
from k3deploy.core.stage import now
from k3deploy.flows.campaign import run_attempt
from k3deploy.flows.cluster_lock import cluster_label, hold_cluster
from k3deploy.flows.registry import FINAL, STAGES, Stage, StageOptions, select
from k3deploy.flows.run_abort import teardown_on_abort
from k3deploy.flows.run_labels import labelled_run
from k3deploy.flows.run_options import AS_CONFIGURED, BenchOptions, DraftChoice, apply_options
from k3deploy.flows.server_watch import RunSoFar, watch_server
from k3deploy.records.alerts import alert_message, alert_verdict, send_alert, wanted
from k3deploy.records.record import RunRecord, build_record
from k3deploy.records.run_report import record_run, write_report

StageName = StrEnum("StageName", {s.name: s.name for s in STAGES if s.name != FINAL})  # type: ignore[misc]
# Plain controls in the UI's form (a multi-select, a dropdown): no `| None`, which the form shows as a type switch.
FROM_THE_START = StageName("preflight")

NIGHTLY = "nightly"  # the scheduled deployment (deployments/definitions.py): its bad runs alert


def chosen_stages(only: tuple[str, ...], from_stage: str) -> list[Stage]:
    """The form's choice: no stage ticked and "from preflight" (its defaults) mean every stage."""
    start = None if from_stage == FROM_THE_START else str(from_stage)
    return select([str(s) for s in only] if only else None, start)


AS_CONFIGURED_DRAFT = DraftChoice(AS_CONFIGURED)
CONFIGURED_BENCH = BenchOptions()
STAGE_DEFAULTS = StageOptions()


@flow(name="validate", on_cancellation=[teardown_on_abort], on_crashed=[teardown_on_abort])
def validate(
    config: str,
    only: tuple[StageName, ...] = (),
    from_stage: StageName = FROM_THE_START,
    draft: DraftChoice = AS_CONFIGURED_DRAFT,
    bench: BenchOptions = CONFIGURED_BENCH,
    stages: StageOptions = STAGE_DEFAULTS,
    keep_serving: bool = False,
) -> dict[str, Any]:
    """preflight → … → launch → smoke → bench → accuracy → teardown, then the run record and the report.

    Args:
        config: The name of a saved DeploymentConfig block, or a deployment YAML path on the worker.
        only: Run just these stages (preflight always runs first, teardown last); none chosen: every stage.
        from_stage: Run from this stage on (preflight always runs first); preflight: every stage.
        draft: The DSpark draft to serve with: as configured, none, or one of the known drafts.
        bench: This run's bench workloads, concurrency sweep and a baseline run to compare with.
        stages: The stages' own options: download, full_verify (models), fresh (comm).
        keep_serving: Leave the service running at the end instead of tearing it down.
    """
    cfg = apply_options(resolve_config(config), str(draft), bench)
    run_id = str(runtime.flow_run.id)
    try:
        chosen = chosen_stages(only, from_stage)
    except ValueError as err:
        raise ValidateFailed(str(err)) from None
    # The top-level run holds the cluster; a validate called as a subflow runs under its parent's turn.
    top_level = runtime.flow_run.parent_flow_run_id is None
    turn = hold_cluster(cfg.cluster, runtime.flow_run.id, runtime.flow_run.name) if top_level else nullcontext()
    labels = labelled_run(runtime.flow_run.id) if top_level else nullcontext()  # what a crash alert names
    so_far = RunSoFar(run_id, runtime.flow_run.name, cfg, [s.name for s in chosen])
    with turn, labels, watch_server(so_far):
        attempt = run_attempt(chosen, cfg, stages.model_dump(), run_id, keep_serving=keep_serving)
        record = build_record(run_id, runtime.flow_run.name, cfg, attempt.results, attempt.started_at, now())
        so_far.record = record
        path = record_run(record)
        report = write_report(record, bench.baseline_run)
        alert(cfg, record, report)
    get_run_logger().info("run record: %s; report: %s", path, report["report"])
    failed = attempt.first_failure()
    if failed is not None:
        raise ValidateFailed(f"validate failed at {failed.stage}: {failed.reason or failed.summary}")
    return {"run_id": run_id, "verdict": record.verdict, "record": path, **report}


def is_nightly(deployment_name: str | None) -> bool:
    """The scheduled deployment, one cluster's (`nightly`) or a fleet's (`nightly-<cluster>`)."""
    return deployment_name is not None and (deployment_name == NIGHTLY or deployment_name.startswith(f"{NIGHTLY}-"))


def alert(cfg: DeploymentConfig, record: RunRecord, report: dict[str, str]) -> None:
    """Tell the webhook of a bad nightly run (of any run with alerts.every_run); a failed POST fails only
    the alert task, never the run's verdict."""
    verdict = alert_verdict(record, report.get("comparison"))
    if not wanted(cfg.alerts, verdict, nightly=is_nightly(runtime.deployment.name)):
        return
    ui = PREFECT_UI_URL.value()
    link = f"{ui.rstrip('/')}/runs/flow-run/{record.run_id}" if ui else None
    message = alert_message(record, report.get("comparison"), cluster_label(cfg.cluster), report["report"], link)
    send_alert(cfg.alerts, message, return_state=True)
