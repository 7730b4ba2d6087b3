"""The campaign engine: one attempt of the pipeline's stages, the run loop that validate, bisect's experiments and
tune's cells share (and the conformance, capacity and soak work to come).

An attempt runs its stages in order as subflows under the serving context (a crash or cancellation tears its
service down), records every stage after the first failure as skipped, not run, then tears down unless told to
keep a passing service up, and tells the listeners as each stage starts and ends. A stage may be taken from an
earlier pass instead of run (`reuse`: bisect's ends); a cached stage passed in an earlier attempt of the same
run with the same inputs is not run again (the one resume rule: what is already judged is not run again).
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from prefect.logging import get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import K3DeployError, StageFailed
from k3deploy.core.stage import FailureCause, FailureClass, StageResult, Verdict, held, now
from k3deploy.flows.registry import BY_NAME, FINAL, Stage
from k3deploy.flows.run_abort import serving
from k3deploy.tasks.stage_cache import stage_inputs_key, stage_task
from k3deploy.tasks.stage_run import error_cause


@dataclass(frozen=True)
class Event:
    """What a listener hears: a stage, an experiment or a cell starting (no result, no outcome) or ending; a long
    stage's step done (a capacity probe, a soak window: `progress`, its line the outcome)."""

    kind: Literal["stage", "experiment", "cell", "progress"]
    name: str
    result: StageResult | None = None  # a stage's, when it ended
    outcome: str | None = None  # an experiment's or cell's one-line outcome, when it ended

    @property
    def ended(self) -> bool:
        return self.result is not None or self.outcome is not None


R = TypeVar("R")  # a campaign's record (bisect's, tune's)

# How the CLI shows the progress of an in-process run: called with every Event, in order.
LISTENERS: list[Callable[[Event], None]] = []


def tell(event: Event) -> None:
    for listener in LISTENERS:
        listener(event)


@dataclass
class Attempt:
    """The stages' results in order, and for each stage taken from an earlier pass, whose pass it was."""

    results: list[StageResult] = field(default_factory=list)
    reused_from: dict[str, str] = field(default_factory=dict)
    started_at: Any = field(default_factory=now)

    def first_failure(self) -> StageResult | None:
        return next((r for r in self.results if r.verdict is Verdict.FAIL), None)


def start_record(own: R | None, new: Callable[[], R], earlier: Callable[[], R] | None,
                    carry: Callable[[R, R], None]) -> R:  # fmt: skip
    """The one resume rule of a campaign's record (bisect's, tune's): what is already judged is not run again
    unless asked. A Retry of the same flow run takes up its `own` record (every attempt judged in it); a
    resume (`earlier` given) starts a `new` record and `carry`s the earlier one's judged attempts into it;
    else the record is new. (validate's stages follow the same rule through Prefect's cache: `run_stage`.)"""
    if own is not None:
        return own
    record = new()
    if earlier is not None:
        carry(record, earlier())
    return record


def run_stage(stage: Stage, cfg: DeploymentConfig, options: dict[str, Any], run_id: str) -> StageResult:
    """One stage as a subflow; a failure comes back as its StageResult (the subflow run is Failed)."""
    tell(Event("stage", stage.name))
    started = now()
    chosen = {k: v for k, v in options.items() if k in stage.options}
    reused = False
    try:
        if stage.cached:
            key = stage_inputs_key(stage, cfg, options, run_id)
            state = stage_task()(stage.name, stage.load(), cfg, chosen, key, return_state=True)
            result = state.result()
            reused = state.name == "Cached"
            if reused:
                get_run_logger().info("%s passed in an earlier attempt of this run with the same inputs", stage.name)
        else:
            result = stage.load()(config=cfg, **chosen)
    except StageFailed as err:
        result = err.result
    except K3DeployError as err:  # a stage that failed before it could gather findings
        result = StageResult(stage=stage.name, verdict=Verdict.FAIL, reason=str(err), started_at=started,
                             failure=error_cause(err, None))  # fmt: skip
    except Exception as err:  # k3deploy's own fault: the stage fails, and teardown and the record still follow
        logging.getLogger("k3deploy.campaign").exception("%s: an error in k3deploy itself", stage.name)
        reason = f"an error in k3deploy itself: {type(err).__name__}: {err}"
        cause = FailureCause(failure_class=FailureClass.TOOL, evidence=reason)
        result = StageResult(stage=stage.name, verdict=Verdict.FAIL, reason=reason, started_at=started, failure=cause)
    result = held(result, len(cfg.cluster.nodes), started, reused)
    tell(Event("stage", stage.name, result=result))
    return result


def run_attempt(
    stages: Sequence[Stage],
    cfg: DeploymentConfig,
    options: dict[str, Any],
    run_id: str,
    *,
    teardown: bool = True,
    keep_serving: bool = False,
    reuse: Callable[[Stage], tuple[str, StageResult] | None] | None = None,
) -> Attempt:
    """`stages` in order, each skipped once one failed; then teardown (when asked, and unless `keep_serving` with
    nothing failed: then a skipped teardown row says the service is left up)."""
    attempt = Attempt()
    with serving(run_id, cfg):
        for stage in stages:
            failed = attempt.first_failure()
            if failed is not None:
                reason = f"not run: {failed.stage} failed"
                attempt.results.append(StageResult(stage=stage.name, verdict=Verdict.SKIPPED, reason=reason))
                continue
            taken = reuse(stage) if reuse is not None else None
            if taken is not None:
                attempt.reused_from[stage.name] = taken[0]
            attempt.results.append(taken[1] if taken else run_stage(stage, cfg, options, run_id))
        if keep_serving and attempt.first_failure() is None:
            reason = "keep_serving: the service is left up"
            attempt.results.append(StageResult(stage=FINAL, verdict=Verdict.SKIPPED, reason=reason))
        elif teardown:
            attempt.results.append(run_stage(BY_NAME[FINAL], cfg, {}, run_id))
    return attempt
