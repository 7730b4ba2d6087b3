"""The bisect record: one versioned JSON document per bisect, beside the run records, and how it reads.

It lives in runs/<bisect id>/bisect.json (no record.json there, so history never takes an experiment for
a run); its JSON Schema is `k3deploy/schemas/bisect-record.schema.json` (`python3 -m k3deploy.records.bisect_record`
rewrites it; a test checks it is current). It is written after every experiment: a bisect that stops
resumes from it.
"""

from __future__ import annotations

import json
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Final, Literal

import jinja2
from pydantic import BaseModel, Field, ValidationError

from k3deploy.core.errors import K3DeployError
from k3deploy.core.paths import read_documents, runs_dir, write_document
from k3deploy.core.stage import FailureCause, Verdict
from k3deploy.records.bisect_search import Outcome, Suspect, Target

BISECT_SCHEMA_VERSION: Final = 1
BISECT_NAME = "bisect.json"
BISECT_SCHEMA_PATH = Path(__file__).parents[1] / "schemas" / "bisect-record.schema.json"
GOOD_END, BAD_END = "good end", "bad end"


class ExperimentStage(BaseModel):
    stage: str
    verdict: Verdict
    reason: str = ""
    node_seconds: float = Field(ge=0, description="Cluster time this experiment spent on the stage.")
    saved_node_seconds: float = Field(default=0.0, ge=0, description="What reusing an earlier pass saved.")
    reused_from: str | None = Field(default=None, description="The run (or this bisect) whose pass was reused.")


class Experiment(BaseModel):
    """One run of the pipeline from launch on, with some suspects at the bad end's values."""

    name: str = Field(description="'bad end', 'good end', or the suspects taken from the bad end ('+key').")
    applied: list[str] = Field(description="The suspects at the bad end's values; the rest at the good end's.")
    started_at: datetime
    ended_at: datetime
    stages: list[ExperimentStage]
    reproduces: bool | None = Field(description="Like the bad end (true), the good end (false), or neither (null).")
    value: float | None = Field(default=None, description="The judged figure (a cell's median over its repeats).")
    spread: list[float] = Field(default_factory=list, description="The judged figure's min and max over its repeats.")
    evidence: str = Field(description="What the judgement rests on: the figure against both ends, or the failure.")
    failed_stage: str | None = None
    failure: FailureCause | None = None
    node_seconds: float = Field(ge=0)
    saved_node_seconds: float = Field(ge=0)


class Finding(BaseModel):
    """One search's conclusion: what it judged on, and what it named. A bisect has more than one when the run
    with the first culprits reverted still fails, at another stage or the same: the next search takes that on."""

    target: Target
    outcome: Outcome

    def describe(self) -> str:
        named = ", ".join(self.outcome.culprits) or "(none)"
        cls = f" ({self.outcome.failure_class.value})" if self.outcome.failure_class else ""
        return f"{self.outcome.verdict.value}: {named}{cls} — {self.target.describe()}"


class FixCheck(BaseModel):
    """The bad end with the culprits put back to the good end's values, run through every stage the bad run
    planned: does reverting them make the run pass?"""

    reverted: list[str]
    experiment: str | None = Field(description="The experiment that showed it (null: the budget ran out first).")
    passed: bool | None = Field(description="Every planned stage passed (and the judged figure is back on the good "
                                            "end's side); null: not run.")  # fmt: skip
    evidence: str

    def describe(self) -> str:
        reverted = ", ".join(self.reverted)
        if self.passed:
            return f"reverting {reverted} makes the run pass: {self.evidence}"
        if self.passed is None:
            return f"reverting {reverted}: not verified, {self.evidence}"
        return f"reverting {reverted} leaves the run failing: {self.evidence}"


class BisectRecord(BaseModel):
    schema_version: Literal[1] = BISECT_SCHEMA_VERSION
    bisect_id: str
    bisect_name: str | None = None
    bad_run: str
    good_run: str
    started_at: datetime
    ended_at: datetime | None = None
    max_experiments: int = Field(ge=1)
    target: Target = Field(description="What each experiment is judged on.")
    suspects: list[Suspect] = Field(description="The differences the bisect can vary.")
    fixed: list[str] = Field(default_factory=list, description="Differences no experiment can vary (the nodes').")
    experiments: list[Experiment] = Field(default_factory=list)
    resumed_from: str | None = Field(default=None, description="The bisect whose experiments this one took over.")
    planned: list[str] = Field(default_factory=list, description="The stages the bad run planned (preflight and "
                                                                  "teardown aside): what the good end and a fix "
                                                                  "check run through.")  # fmt: skip
    outcome: Outcome | None = Field(default=None, description="null while it runs, or when it stopped early.")
    findings: list[Finding] = Field(default_factory=list, description="Each search's conclusion, in order: the "
                                    "first on the bad run's target, then what failed once its culprits were "
                                                              "reverted.")  # fmt: skip
    fix: FixCheck | None = Field(default=None, description="The last check of the culprits: reverted, does it pass?")
    cluster_hours: float = Field(default=0.0, ge=0, description="Node-hours the bisect held the cluster for.")
    saved_cluster_hours: float = Field(default=0.0, ge=0, description="Node-hours reuse of passed stages saved.")

    def spend(self) -> str:
        return (f"cluster time: {self.cluster_hours:.4g} node-hours spent, {self.saved_cluster_hours:.4g} saved by "
                "reusing stages that passed")  # fmt: skip


def experiment_name(applied: frozenset[str], names: list[str]) -> str:
    if applied == frozenset(names):
        return BAD_END
    if not applied:
        return GOOD_END
    return " ".join(f"+{name}" for name in sorted(applied))


def write_bisect(record: BisectRecord, root: Path | None = None) -> Path:
    """runs/<bisect id>/bisect.json, written whole."""
    return write_document(record.bisect_id, BISECT_NAME, record, root)


def all_bisects(root: Path | None = None) -> list[BisectRecord]:
    """Every readable bisect of the runs store, newest first."""
    return sorted(read_documents(BISECT_NAME, BisectRecord, root), key=lambda r: r.started_at, reverse=True)


def bisects_of(bad_run: str, root: Path | None = None) -> list[BisectRecord]:
    """The readable bisects of a run, newest first."""
    return [r for r in all_bisects(root) if r.bad_run == bad_run]


def read_bisect(bisect_id: str, root: Path | None = None) -> BisectRecord | None:
    path = (root or runs_dir()) / bisect_id / BISECT_NAME
    if not path.exists():
        return None
    try:
        return BisectRecord.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError) as err:
        raise K3DeployError(f"{path}: not a bisect record: {str(err).splitlines()[0]}") from None


# -- reading it ---------------------------------------------------------------------------------------------------


def experiment_rows(record: BisectRecord) -> list[dict[str, str]]:
    def shown(e: Experiment) -> str:
        return "like the bad end" if e.reproduces else "like the good end" if e.reproduces is False else "neither"

    return [
        {
            "experiment": e.name,
            "verdict": shown(e),
            "evidence": e.evidence,
            "reused": ", ".join(s.stage for s in e.stages if s.reused_from) or "-",
            "node·s": f"{e.node_seconds:.0f} (+{e.saved_node_seconds:.0f} saved)",
        }
        for e in record.experiments
    ]


def verdict_line(record: BisectRecord) -> str:
    if record.outcome is None:
        return f"unfinished after {len(record.experiments)} experiment(s): `k3deploy bisect {record.bad_run} --resume`"
    outcome = record.outcome
    named = f": {', '.join(outcome.culprits)}" if outcome.culprits else ""
    cls = f" ({outcome.failure_class.value})" if outcome.failure_class else ""
    return f"{outcome.verdict.value}{named}{cls} — {outcome.reason}"


def conclusion_lines(record: BisectRecord) -> list[str]:
    """Each search's finding (when there was more than one) and the fix check, one line each."""
    several = len(record.findings) > 1
    lines = [f"finding {i}: {f.describe()}" for i, f in enumerate(record.findings, 1)] if several else []
    return lines + ([f"fix: {record.fix.describe()}"] if record.fix else [])


def bisect_markdown(record: BisectRecord) -> str:
    lines = [f"# bisect of run {record.bad_run} (last pass {record.good_run})", "", f"**{verdict_line(record)}**"]
    conclusions = conclusion_lines(record)
    lines += [""] + [f"- {line}" for line in conclusions] if conclusions else []
    lines += ["", f"Judged on: {record.target.describe()}.", "", "## Suspects", ""]
    lines += [f"- {s.name} ({s.kind.value}): {s.describe()}" for s in record.suspects] or ["- (none)"]
    if record.fixed:
        lines += ["", "Differences no experiment can vary:", ""] + [f"- {f}" for f in record.fixed]
    lines += ["", "## Experiments", "", "| experiment | verdict | evidence | reused | node·s |", "|" + "---|" * 5]
    lines += [f"| {' | '.join(row.values())} |" for row in experiment_rows(record)]
    return "\n".join([*lines, "", record.spend() + "."]) + "\n"


def bisect_html(record: BisectRecord) -> str:
    """The bisect's section of the bad run's HTML report (k3deploy/templates/bisect_section.html.j2)."""
    text = resources.files("k3deploy").joinpath("templates/bisect_section.html.j2").read_text()
    template = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(text)
    return template.render(record=record, verdict=verdict_line(record), conclusions=conclusion_lines(record),
                           rows=experiment_rows(record))  # fmt: skip


def json_schema() -> dict[str, Any]:
    schema = BisectRecord.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://k3deploy/bisect-record/v{BISECT_SCHEMA_VERSION}"
    return schema


if __name__ == "__main__":
    BISECT_SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2) + "\n")
    print(f"wrote {BISECT_SCHEMA_PATH}")
