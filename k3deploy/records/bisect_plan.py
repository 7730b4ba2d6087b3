"""What a bisect does next, read from its record alone: the search's next experiment, the check of a culprit by
its fix, and the search of what fails once it is reverted.

A culprit is not the answer until reverting it is shown to work: the bad end with the culprits put back runs
through every stage the bad run planned. If it passes, the fix is verified; if it fails — another key broke
another stage, or the same one — that failure is the next search's target, over the suspects left. The good
end runs through every planned stage too, so a later search and the fix check can take it as it is.

A pure function of the record (its experiments, its budget): a resumed or retried bisect picks up where it
stopped, and every step is testable without a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from k3deploy.core.stage import Verdict
from k3deploy.records.bisect_record import BisectRecord, Experiment, Finding, FixCheck, experiment_name
from k3deploy.records.bisect_search import BisectVerdict, Need, Outcome, Target, next_step, way_to_bad

NAMED = (BisectVerdict.CULPRIT, BisectVerdict.INTERACTION)
UNKNOWN = "unknown"  # an experiment that stopped before the stage a later search judges


@dataclass(frozen=True)
class Run:
    """The next experiment: these suspects at the bad end's values, run through `through`, judged on `target`."""

    applied: frozenset[str]
    through: str
    target: Target
    name: str


@dataclass(frozen=True)
class Decided:
    findings: list[Finding]
    fix: FixCheck | None
    outcome: Outcome


def ran(experiment: Experiment) -> list[str]:
    """The stages an experiment ran or took from an end (whatever their verdict but skipped), in order."""
    return [s.stage for s in experiment.stages if s.verdict is not Verdict.SKIPPED]


def judged(target: Target, experiment: Experiment) -> bool | str | None:
    """Like the bad end (True), the good end (False), neither (None) — or "unknown" when the experiment did not
    run as far as the target's stage (UNKNOWN: it stopped at an earlier target, having passed)."""
    if experiment.failed_stage is not None:
        same = experiment.failure is not None and experiment.failure.failure_class == target.failure_class
        if target.kind == "failure" and experiment.failed_stage == target.stage and same:
            return True
        return None
    if target.stage not in ran(experiment):
        return UNKNOWN
    if target.kind == "failure":
        return False
    if experiment.value is None or target.good is None or target.bad is None:
        return None
    return way_to_bad(experiment.value, target.good, target.bad) > 0.5


def _through_plan(experiment: Experiment, planned: Sequence[str]) -> bool:
    """It failed somewhere, or ran every planned stage: it says whether its config passes the run."""
    return experiment.failed_stage is not None or set(planned) <= set(ran(experiment))


def plan(record: BisectRecord) -> Run | Decided:
    """The next experiment, or what the experiments done decide: each search's finding and the fix check."""
    names = [s.name for s in record.suspects]
    planned = record.planned or [record.target.stage]
    last = planned[-1]
    findings: list[Finding] = []
    culprits: list[str] = []
    fix: FixCheck | None = None
    target = record.target
    for _ in range(len(names) + 1):
        remaining = [n for n in names if n not in culprits]
        done: dict[frozenset[str], bool | None] = {}
        for e in record.experiments:  # the latest of each set decides
            verdict = judged(target, e)
            if frozenset(e.applied) <= set(remaining) and verdict != UNKNOWN:
                done[frozenset(e.applied)] = verdict  # type: ignore[assignment]
        spent_elsewhere = len(record.experiments) - len(done)
        step = next_step(remaining, done, record.max_experiments - spent_elsewhere, target)
        if isinstance(step, Need):
            through = last if not step.applied else target.stage  # the good end: every stage, once
            return Run(step.applied, through, target, experiment_name(step.applied, names))
        findings.append(Finding(target=target, outcome=step))
        if step.verdict not in NAMED:
            break
        culprits += [c for c in step.culprits if c not in culprits]
        rest = frozenset(n for n in names if n not in culprits)
        shown = [e for e in record.experiments if frozenset(e.applied) == rest and _through_plan(e, planned)]
        if not shown:
            if len(record.experiments) >= record.max_experiments:
                fix = FixCheck(reverted=list(culprits), experiment=None, passed=None,
                               evidence=f"the budget of {record.max_experiments} experiments is spent")  # fmt: skip
                break
            return Run(rest, last, target, f"bad end without {', '.join(culprits)}")
        check = shown[-1]
        still = judged(target, check) is True
        if check.failed_stage is None and not still:
            fix = FixCheck(reverted=list(culprits), experiment=check.name, passed=True,
                           evidence=f"every planned stage ({', '.join(planned)}) passed in {check.name}"
                                    + (f": {check.evidence}" if target.kind == "figure" else ""))  # fmt: skip
            break
        cause = check.failure.describe() if check.failure else check.evidence
        where = f"{check.failed_stage} fails in {check.name}" if check.failed_stage else f"{check.name}: {cause}"
        fix = FixCheck(reverted=list(culprits), experiment=check.name, passed=False,
                       evidence=f"{where}: {cause}" if check.failed_stage else where)  # fmt: skip
        if check.failed_stage is not None:
            target = Target(kind="failure", key=check.failed_stage, stage=check.failed_stage,
                            failure_class=check.failure.failure_class if check.failure else None)  # fmt: skip
        if not rest:
            break
    return Decided(findings, fix, overall(findings))


def overall(findings: Sequence[Finding]) -> Outcome:
    """One search: its outcome. Several: every culprit named, in the order found, each finding's class in the
    reason; undecided if the last search ran out of budget (a resume goes on)."""
    first = findings[0].outcome
    if len(findings) == 1:
        return first
    named = [f for f in findings if f.outcome.verdict in NAMED]
    culprits = [c for f in named for c in f.outcome.culprits]
    verdict = BisectVerdict.UNDECIDED if findings[-1].outcome.verdict is BisectVerdict.UNDECIDED else first.verdict
    reason = "; then, those reverted, ".join(f"{', '.join(f.outcome.culprits) or f.outcome.verdict.value}: "
                                             f"{f.target.describe()}" for f in findings)  # fmt: skip
    return Outcome(verdict=verdict, culprits=culprits, reason=reason)  # each finding has its own class
