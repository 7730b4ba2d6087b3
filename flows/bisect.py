"""`bisect`: from "what changed" to "what broke it", by running experiments on the cluster.

It takes a REGRESSED or failed run and its last pass of the same config family, lists the suspects, and
asks the search (bisect_search.next_step) for one experiment at a time: the pipeline from launch to the
judged stage, with some suspects at the bad end's values. Models, comm and image are reused from the run
(either end) whose pass had the same inputs, else run once in this bisect. It holds the cluster like
validate, checks host keys once (preflight), and writes its record after every experiment: a Retry of
the same flow run, or `--resume`, takes up the experiments already done.
"""

from typing import Any

from prefect import flow, runtime
from prefect.artifacts import create_markdown_artifact
from prefect.logging import get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.source import resolve_config
from k3deploy.core.errors import ValidateFailed
from k3deploy.core.stage import StageResult, now
from k3deploy.flows.campaign import Event, run_attempt, run_stage, start_record, tell
from k3deploy.flows.cluster_lock import hold_cluster
from k3deploy.flows.registry import BY_NAME, FINAL, STAGES, Stage, StageOptions
from k3deploy.flows.run_abort import teardown_on_abort
from k3deploy.records.bisect_plan import Run, plan
from k3deploy.records.bisect_record import (
    BisectRecord,
    Experiment,
    ExperimentStage,
    bisect_markdown,
    bisects_of,
    conclusion_lines,
    read_bisect,
    write_bisect,
)
from k3deploy.records.bisect_search import compose, experiment_config, judge_experiment, reused_pass, target_of
from k3deploy.records.bisect_search import suspects as find_suspects
from k3deploy.records.history import RegressionVerdict, comparable
from k3deploy.records.record import RunRecord, build_record, read_record, scan_records
from k3deploy.records.run_report import add_to_report, judged, regressed_keys, share

DEFAULTS = StageOptions()
BODY = [s.name for s in STAGES if s.name not in ("preflight", FINAL)]  # what an experiment can run


@flow(name="bisect", on_cancellation=[teardown_on_abort], on_crashed=[teardown_on_abort])
def bisect(
    run: str,
    config: str = "",
    good_run: str = "",
    max_experiments: int = 8,
    resume: bool = False,
) -> dict[str, Any]:
    """Find the smallest set of differences since the last pass that reproduces a regression or failure.

    Args:
        run: The REGRESSED or failed run (its id or a unique prefix).
        config: A DeploymentConfig block name or YAML path whose secrets the experiments use (the records hold
            none); empty when the deployment has none.
        good_run: The passing run to bisect against; empty: the bad run's last pass of the same family.
        max_experiments: Stop (undecided) after this many experiments.
        resume: Take up the experiments of this run's latest bisect that did not finish.
    """
    logger = get_run_logger()
    bad = read_record(run)
    good = read_record(good_run) if good_run else _last_pass(bad)
    bisect_id = str(runtime.flow_run.id)
    record = _start(bisect_id, bad, good, max_experiments, resume)
    credentials = resolve_config(config) if config else None
    base = experiment_config(bad.config, credentials)
    names = [s.name for s in record.suspects]
    logger.info("bisect of %s against %s: %d suspect(s) %s; judged on %s", bad.run_id, good.run_id, len(names),
                names, record.target.describe())  # fmt: skip
    with hold_cluster(base.cluster, runtime.flow_run.id, runtime.flow_run.name):
        started = now()
        preflight = run_stage(BY_NAME["preflight"], base, {}, bisect_id)  # every run checks host keys
        record.cluster_hours += preflight.node_seconds / 3600
        if not preflight.passed:
            write_bisect(record)
            raise ValidateFailed(f"bisect stopped at preflight: {preflight.reason or preflight.summary}")
        step = plan(record)
        while isinstance(step, Run):
            cfg = experiment_config(compose(bad.config, record.suspects, set(step.applied)), credentials)
            experiment = run_experiment(cfg, step, (good, bad), bisect_id)
            record.experiments.append(experiment)
            record.cluster_hours += experiment.node_seconds / 3600
            record.saved_cluster_hours += experiment.saved_node_seconds / 3600
            write_bisect(record)
            step = plan(record)
        record.outcome, record.findings, record.fix, record.ended_at = step.outcome, step.findings, step.fix, now()
        for line in conclusion_lines(record):
            logger.info("%s", line)
        logger.info("bisect took %.0f s", (record.ended_at - started).total_seconds())
    record.cluster_hours = round(record.cluster_hours, 4)
    record.saved_cluster_hours = round(record.saved_cluster_hours, 4)
    path = write_bisect(record)
    markdown = bisect_markdown(record)
    outcome = step.outcome
    create_markdown_artifact(markdown, key="bisect", description=f"bisect of run {bad.run_id}: {outcome.verdict.value}")
    report = add_to_report(bad.run_id, record)
    for folder in (bisect_id, bad.run_id):  # the bisect, and the bad run's report that now shows it
        share(folder, logger)
    logger.info("bisect record: %s; %s; %s", path, outcome.verdict.value, record.spend())
    return {"bisect_id": bisect_id, "verdict": outcome.verdict.value, "culprits": outcome.culprits,
            "fix_verified": bool(record.fix and record.fix.passed), "record": str(path), "report": report}  # fmt: skip


def _last_pass(bad: RunRecord) -> RunRecord:
    """The newest earlier run of the family that passed and was not itself judged REGRESSED or MISSING."""
    passes = comparable(bad, scan_records().records, 10**6)
    for run in reversed(passes):
        if judged(run) not in (RegressionVerdict.REGRESSED, RegressionVerdict.MISSING):
            return run
    raise ValidateFailed(f"run {bad.run_id} has no earlier passing run of its config family to bisect against")


def _start(bisect_id: str, bad: RunRecord, good: RunRecord, budget: int, resume: bool) -> BisectRecord:
    """This bisect's record: its own on a Retry, an unfinished earlier one's experiments on --resume, else new."""

    def new() -> BisectRecord:
        suspects, fixed = find_suspects(good, bad)
        target = target_of(good, bad, regressed_keys(bad))
        planned = [s.stage for s in bad.stages if s.stage in BODY]
        return BisectRecord(bisect_id=bisect_id, bisect_name=runtime.flow_run.name, bad_run=bad.run_id,
                            good_run=good.run_id, started_at=now(), max_experiments=budget, target=target,
                            suspects=suspects, fixed=fixed, planned=planned)  # fmt: skip

    def earlier() -> BisectRecord:
        found = next((b for b in bisects_of(bad.run_id) if b.good_run == good.run_id), None)
        if found is None:
            raise ValidateFailed(f"--resume: run {bad.run_id} has no earlier bisect against {good.run_id}")
        return found

    def carry(record: BisectRecord, done: BisectRecord) -> None:
        record.experiments, record.resumed_from = list(done.experiments), done.bisect_id
        record.cluster_hours, record.saved_cluster_hours = done.cluster_hours, done.saved_cluster_hours

    own = read_bisect(bisect_id)
    if own is not None:
        own = own.model_copy(update={"max_experiments": budget})
    return start_record(own, new, earlier if resume else None, carry)


def run_experiment(cfg: DeploymentConfig, step: Run, ends: tuple[RunRecord, RunRecord], bisect_id: str) -> Experiment:
    """One attempt of the campaign engine: the pipeline up to the stage the step asks for (launch on; cached
    stages taken from an end that passed them with these inputs), then teardown; judged against both ends."""
    name, applied, target = step.name, step.applied, step.target
    tell(Event("experiment", name))
    body = [s for s in STAGES if s.name in BODY]
    upto = body[: [s.name for s in body].index(step.through) + 1]
    options = DEFAULTS.model_dump()

    def from_an_end(stage: Stage) -> tuple[str, StageResult] | None:
        return reused_pass(stage, cfg, ends, options) if stage.cached else None

    launched = any(s.name == "launch" for s in upto)
    attempt = run_attempt(upto, cfg, options, bisect_id, teardown=launched, reuse=from_an_end)
    rows = [_row(r, attempt.reused_from.get(r.stage) or ("this bisect" if r.saved_node_seconds else None))
            for r in attempt.results]  # fmt: skip
    record = build_record(f"{bisect_id}:{name}", name, cfg, attempt.results, attempt.started_at, now())
    judgement = judge_experiment(target, record)
    experiment = Experiment(name=name, applied=sorted(applied), started_at=attempt.started_at, ended_at=now(),
                            stages=rows, reproduces=judgement.reproduces, value=judgement.value,
                            spread=judgement.spread, evidence=judgement.evidence, failed_stage=record.failed_stage,
                            failure=record.failure, node_seconds=round(sum(r.node_seconds for r in rows), 1),
                            saved_node_seconds=round(sum(r.saved_node_seconds for r in rows), 1))  # fmt: skip
    get_run_logger().info("experiment %s: %s", name, judgement.evidence)
    like = {True: "like the bad end", False: "like the good end", None: "neither"}[experiment.reproduces]
    tell(Event("experiment", name, outcome=f"{like}: {experiment.evidence}"))
    return experiment


def _row(result: StageResult, reused_from: str | None) -> ExperimentStage:
    return ExperimentStage(stage=result.stage, verdict=result.verdict, reason=result.reason,
                           node_seconds=result.node_seconds, saved_node_seconds=result.saved_node_seconds,
                           reused_from=reused_from)  # fmt: skip
