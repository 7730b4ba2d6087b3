"""`validate`: the stages in sequence as subflows, teardown at the end, one run record.

Stages run one after another (concurrent subflows can pick up each other's results on a retry,
Prefect issue #22259). Cached stages persist their results, so the UI's Retry of a failed run
(the same flow run) does not execute again the stages that passed; preflight, launch and teardown
always run.
"""

from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

from prefect import flow, runtime, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger
from pydantic import Field

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.errors import K3DeployError, StageFailed, ValidateFailed
from k3deploy.flows.registry import BY_NAME, FINAL, STAGES, Stage, select
from k3deploy.record import RunRecord, build_record, write_record
from k3deploy.stage import StageResult, Verdict, now

StageName = StrEnum("StageName", {s.name: s.name for s in STAGES if s.name != FINAL})  # type: ignore[misc]

# Called as (stage, result or None when it starts): how the CLI shows progress of an in-process run.
LISTENERS: list[Callable[[str, StageResult | None], None]] = []


def _tell(stage: str, result: StageResult | None) -> None:
    for listener in LISTENERS:
        listener(stage, result)


def run_stage(stage: Stage, cfg: DeploymentConfig, options: dict[str, Any]) -> StageResult:
    """One stage as a subflow; a failure comes back as its StageResult (the subflow run is Failed)."""
    _tell(stage.name, None)
    started = now()
    try:
        result = stage.load()(config=cfg, **{k: v for k, v in options.items() if k in stage.options})
    except StageFailed as err:
        result = err.result
    except K3DeployError as err:  # a stage that failed before it could gather findings
        result = StageResult(stage=stage.name, verdict=Verdict.FAIL, reason=str(err), started_at=started)
    _tell(stage.name, result)
    return result


def _first_failure(results: list[StageResult]) -> StageResult | None:
    return next((r for r in results if r.verdict is Verdict.FAIL), None)


@task(name="write run record", cache_policy=NO_CACHE)
def record_run(record: RunRecord) -> str:
    path = write_record(record)
    rows = [
        {"stage": s.stage, "verdict": s.verdict.value, "seconds": s.seconds, "summary": s.summary or s.reason}
        for s in record.stages
    ]
    create_table_artifact(rows, key="validate-stages", description=f"run {record.run_id}: {record.verdict}")
    lines = [f"# validate: {record.verdict.upper()}", "", f"run record: `{path.resolve()}`", ""]
    lines += [f"- **{r['stage']}** {r['verdict']} in {r['seconds']} s: {r['summary']}" for r in rows]
    create_markdown_artifact("\n".join(lines) + "\n", key="validate-record", description="run verdict and record")
    return str(path)


@flow(name="validate")
def validate(
    config: Annotated[
        ConfigSource, Field(description="Deployment YAML path, or the name of a saved DeploymentConfig block.")
    ],
    only: Annotated[
        list[StageName] | None,
        Field(description="Run just these stages (preflight always runs first)."),
    ] = None,
    from_stage: Annotated[
        StageName | None,
        Field(description="Run from this stage on (preflight always runs first)."),
    ] = None,
    keep_serving: Annotated[bool, Field(description="Leave the service running instead of tearing it down.")] = False,
    fresh: Annotated[bool, Field(description="Run cached checks (comm) again even when a pass is recent.")] = False,
    download: Annotated[bool, Field(description="Download missing or bad checkpoint files (else fail).")] = True,
) -> dict[str, Any]:
    """preflight → … → launch → smoke → bench → accuracy → teardown, then the run record; fails naming the stage."""
    cfg = resolve_config(config)
    logger = get_run_logger()
    run_id = str(runtime.flow_run.id)
    started = now()
    try:
        chosen = select([str(s) for s in only] if only else None, str(from_stage) if from_stage else None)
    except ValueError as err:
        raise ValidateFailed(str(err)) from None
    options = {"fresh": fresh, "download": download}
    results: list[StageResult] = []
    for stage in chosen:
        failed = _first_failure(results)
        if failed is not None:
            reason = f"not run: {failed.stage} failed"
            results.append(StageResult(stage=stage.name, verdict=Verdict.SKIPPED, reason=reason))
        else:
            results.append(run_stage(stage, cfg, options))
    if keep_serving and _first_failure(results) is None:
        results.append(StageResult(stage=FINAL, verdict=Verdict.SKIPPED, reason="keep_serving: the service is left up"))
    else:
        results.append(run_stage(BY_NAME[FINAL], cfg, {}))
    record = build_record(run_id, runtime.flow_run.name, cfg, results, started, now())
    path = record_run(record)
    logger.info("run record: %s", path)
    failed = _first_failure(results)
    if failed is not None:
        raise ValidateFailed(f"validate failed at {failed.stage}: {failed.reason or failed.summary}")
    return {"run_id": run_id, "verdict": record.verdict, "record": path}
