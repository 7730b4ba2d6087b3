"""What a bisect does after the search names a culprit (k3deploy/records/bisect_plan.py): the fix checked by a
run of the bad end without it through every planned stage, and what fails then searched in turn.

Each case plays a bisect to its end against an oracle of what each config does (the experiments a real bisect
would record), asking `plan` for the next experiment after each one, as the flow does."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from k3deploy.core.stage import FailureCause, FailureClass, Verdict
from k3deploy.records.bisect_plan import Decided, Run, judged, plan
from k3deploy.records.bisect_record import BisectRecord, Experiment, ExperimentStage
from k3deploy.records.bisect_search import BisectVerdict, Suspect, SuspectKind, Target

PLANNED = ["models", "comm", "image", "launch", "smoke", "bench"]
T0 = datetime(2026, 12, 7, tzinfo=UTC)
# what a config does: (the stage it fails at, its class) or None when it passes; and its judged figure
Oracle = Callable[[frozenset[str]], tuple[tuple[str, FailureClass] | None, float]]


def record(names: list[str], target: Target, budget: int = 8) -> BisectRecord:
    suspects = [Suspect(name=n, kind=SuspectKind.CONFIG, good={n: 1}, bad={n: 2}) for n in names]
    return BisectRecord(bisect_id="b", bad_run="bad", good_run="good", started_at=T0, max_experiments=budget,
                        target=target, suspects=suspects, planned=PLANNED)  # fmt: skip


def experiment(step: Run, oracle: Oracle) -> Experiment:
    """The experiment a real run of this step records: stages through `step.through`, skipped after a failure."""
    failure, value = oracle(step.applied)
    rows, failed = [], None
    for stage in PLANNED[: PLANNED.index(step.through) + 1]:
        verdict = Verdict.SKIPPED if failed else Verdict.FAIL if failure and failure[0] == stage else Verdict.PASS
        failed = failed or (stage if verdict is Verdict.FAIL else None)
        rows.append(ExperimentStage(stage=stage, verdict=verdict, node_seconds=1.0))
    cause = FailureCause(failure_class=failure[1], evidence=f"{failure[0]} broke") if failed and failure else None
    measured = value if not failed and "bench" in step.through else None
    done = Experiment(name=step.name, applied=sorted(step.applied), started_at=T0, ended_at=T0, stages=rows,
                      reproduces=None, value=measured, evidence="", failed_stage=failed, failure=cause,
                      node_seconds=1.0, saved_node_seconds=0.0)  # fmt: skip
    return done.model_copy(update={"reproduces": judged(step.target, done)})


def play(bisect: BisectRecord, oracle: Oracle) -> tuple[Decided, list[Run]]:
    steps = []
    while isinstance(step := plan(bisect), Run):
        assert len(steps) < 20, "the plan does not converge"
        steps.append(step)
        bisect.experiments.append(experiment(step, oracle))
    return step, steps


def breaks(rules: dict[str, tuple[str, FailureClass]]) -> Oracle:
    """Each key, when applied, breaks its stage; the earliest stage broken is where the run fails."""

    def oracle(applied: frozenset[str]) -> tuple[tuple[str, FailureClass] | None, float]:
        hits = [rules[k] for k in applied if k in rules]
        return (min(hits, key=lambda h: PLANNED.index(h[0])) if hits else None), 1.0

    return oracle


LAUNCH_FAILS = Target(kind="failure", key="launch", stage="launch", failure_class=FailureClass.CONFIGURATION)


def test_two_changes_breaking_two_stages_are_both_named_each_with_its_stage_and_class_and_the_fix_verified():
    rules = {
        "serve.env.KV": ("launch", FailureClass.CONFIGURATION),
        "serve.reasoning_parser": ("smoke", FailureClass.MODEL),
    }
    decided, steps = play(record(sorted(rules), LAUNCH_FAILS), breaks(rules))
    assert [(s.name, s.through) for s in steps] == [
        ("bad end", "launch"),
        ("good end", "bench"),  # every planned stage: later searches and the fix check take it as it is
        ("+serve.env.KV", "launch"),
        ("bad end without serve.env.KV", "bench"),
    ]
    first, second = decided.findings
    assert (first.outcome.culprits, first.target.stage, first.outcome.failure_class) == (
        ["serve.env.KV"], "launch", FailureClass.CONFIGURATION)  # fmt: skip
    assert (second.outcome.culprits, second.target.stage, second.outcome.failure_class) == (
        ["serve.reasoning_parser"], "smoke", FailureClass.MODEL)  # fmt: skip
    assert decided.outcome.verdict is BisectVerdict.CULPRIT
    assert decided.outcome.culprits == ["serve.env.KV", "serve.reasoning_parser"]
    assert decided.fix is not None and decided.fix.passed is True and decided.fix.experiment == "good end"
    assert decided.fix.reverted == ["serve.env.KV", "serve.reasoning_parser"]
    assert "makes the run pass" in decided.fix.describe()


def test_one_culprit_among_two_is_verified_by_the_run_without_it():
    rules = {"b": ("launch", FailureClass.CONFIGURATION)}
    decided, steps = play(record(["a", "b"], LAUNCH_FAILS), breaks(rules))
    assert [s.name for s in steps] == ["bad end", "good end", "+a", "+b", "bad end without b"]
    assert len(decided.findings) == 1 and decided.outcome.culprits == ["b"]
    assert decided.fix is not None and decided.fix.passed and decided.fix.experiment == "bad end without b"


def test_a_second_key_breaking_the_same_stage_the_same_way_is_found_once_the_first_is_reverted():
    rules = {"a": ("launch", FailureClass.CONFIGURATION), "b": ("launch", FailureClass.CONFIGURATION)}
    decided, steps = play(record(["a", "b", "c"], LAUNCH_FAILS), breaks(rules))
    assert decided.outcome.culprits == ["a", "b"] and len(decided.findings) == 2
    assert decided.fix is not None and decided.fix.passed
    assert len({s.applied for s in steps}) == len(steps)  # no config run twice for the same question


def test_a_figure_culprit_is_verified_by_the_figure_back_on_the_good_side():
    target = Target(kind="figure", key="bench random c2 mean_ttft_ms", stage="bench", higher_is_better=False,
                    good=100.0, bad=500.0)  # fmt: skip

    def slow_with_seqs(applied: frozenset[str]) -> tuple[None, float]:
        return None, 500.0 if "seqs" in applied else 100.0

    decided, steps = play(record(["poll", "seqs"], target), slow_with_seqs)
    assert decided.outcome.culprits == ["seqs"] and decided.fix is not None and decided.fix.passed
    assert [s.name for s in steps] == ["bad end", "good end", "+poll", "+seqs"]  # +poll ran every stage: the fix check


def test_reverting_the_culprit_of_a_figure_that_stays_bad_is_not_a_verified_fix():
    target = Target(kind="figure", key="bench random c2 mean_ttft_ms", stage="bench", higher_is_better=False,
                    good=100.0, bad=500.0)  # fmt: skip

    def slow_with_either(applied: frozenset[str]) -> tuple[None, float]:
        return None, 500.0 if applied & {"x", "y"} else 100.0

    decided, _ = play(record(["x", "y"], target), slow_with_either)
    assert decided.outcome.culprits == ["x", "y"] and len(decided.findings) == 2
    assert decided.fix is not None and decided.fix.passed


@pytest.mark.parametrize("budget", [2, 3])  # four experiments finish it (the first test)
def test_a_budget_spent_stops_it_undecided_or_leaves_the_fix_unverified_and_a_resume_finishes_it(budget):
    rules = {
        "serve.env.KV": ("launch", FailureClass.CONFIGURATION),
        "serve.reasoning_parser": ("smoke", FailureClass.MODEL),
    }
    bisect = record(sorted(rules), LAUNCH_FAILS, budget)
    stopped, steps = play(bisect, breaks(rules))
    assert len(steps) == budget
    if budget == 3:  # the culprit found, the budget gone before its check
        assert stopped.outcome.culprits == ["serve.env.KV"] and stopped.fix is not None
        assert stopped.fix.passed is None and "budget of 3 experiments is spent" in stopped.fix.describe()
    else:
        assert stopped.outcome.verdict is BisectVerdict.UNDECIDED
    resumed = bisect.model_copy(update={"max_experiments": 8})
    finished, more = play(resumed, breaks(rules))
    assert len(steps) + len(more) == 4 and finished.fix is not None and finished.fix.passed


def test_an_experiment_that_stopped_before_a_later_targets_stage_is_not_taken_as_passing_it():
    smoke = Target(kind="failure", key="smoke", stage="smoke", failure_class=FailureClass.MODEL)
    step = Run(frozenset({"a"}), "launch", LAUNCH_FAILS, "+a")
    passed_launch = experiment(step, breaks({}))
    assert judged(LAUNCH_FAILS, passed_launch) is False and judged(smoke, passed_launch) == "unknown"
