"""The stage contract: what every stage returns, whether it passed or not (DESIGN.md, "The stage contract").

`validate`, the CLI, the run record and the report read only these types, so a new stage needs
no code anywhere but its own flow and one line in the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"
    NOT_APPLICABLE = "not-applicable"
    INCONCLUSIVE = "inconclusive"  # cut short by what is not the deployment's: its Prefect server went away


# A whole attempt's verdict (a validate run, a tune cell): it passed, or a stage of it failed; never skipped; or
# it was cut short (a stage inconclusive, none failed) and says nothing of the deployment. The regression verdicts
# (records/history.py) and a bisect's outcome (records/bisect_search.py) are other questions with their own
# states, named for them.
AttemptVerdict = Literal[Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE]


class FailureClass(StrEnum):
    """Whose problem a failure is: what a team acts on without reading logs."""

    INFRASTRUCTURE = "infrastructure"  # node, SSH, host key, NPU link or health, disk, registry, hub
    ENGINE = "engine"  # a fatal line, a rank's death, a stuck rank, a start-up failure, failed requests
    MODEL = "model"  # answers or scores wrong on a healthy engine
    TOOL = "tool"  # the bench tool or an evaluator crashed, or its output is unreadable or not valid evidence
    CONFIGURATION = "configuration"  # the deployment asks for what cannot be


@dataclass(frozen=True)
class Finding:
    """One row of what a stage checked: the subject (a node, 'node1 NPU 3', a checkpoint, a request),
    the check, the outcome, and the value seen or what is wrong and where. A failed finding may say
    whose problem it is (`cause`); otherwise its stage's default class applies. Where a stage knows
    the place as parts (comm: node, NPU, the peer node of a ping) it gives them too."""

    subject: str
    check: str
    ok: bool
    detail: str = ""
    cause: FailureClass | None = None
    node: str | None = None
    npu: int | None = None
    peer: str | None = None


class FailureCause(BaseModel):
    """Why a stage failed, as a class and the evidence for it."""

    failure_class: FailureClass
    evidence: str = Field(description="The line, finding or message that shows the cause.")
    node: str | None = None
    dp_rank: int | None = None
    log_line: int | None = Field(default=None, description="Where the evidence's line is in the node's log (1-based).")
    family: str | None = Field(default=None, description="The kind of failure, when a fatal log pattern knows it.")

    def describe(self) -> str:
        where = (self.node or "") + (f" (DP rank {self.dp_rank})" if self.dp_rank is not None else "")
        where += f", log line {self.log_line}" if self.log_line is not None else ""
        return f"{self.failure_class.value}: " + (f"{where}: " if where else "") + self.evidence


def now() -> datetime:
    return datetime.now(UTC)


class StageResult(BaseModel):
    """What one stage established; the same shape for every stage, passed or failed."""

    stage: str
    verdict: Verdict
    reason: str = Field(default="", description="Why it failed, was skipped or does not apply.")
    summary: str = Field(default="", description="The stage's key figure in a few words, for tables.")
    findings: list[Finding] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict, description="Stage data for the run record (no secrets).")
    artifacts: list[str] = Field(default_factory=list, description="Keys of the Prefect artifacts published.")
    failure: FailureCause | None = Field(default=None, description="A failed stage's class and evidence.")
    started_at: datetime = Field(default_factory=now)
    ended_at: datetime = Field(default_factory=now)
    node_seconds: float = Field(
        default=0.0,
        ge=0,
        description="Cluster time this run spent on the stage: its wall time here × the nodes the run held "
        "(0 when skipped; only the cache lookup when reused from an earlier attempt).",
    )
    saved_node_seconds: float = Field(
        default=0.0, ge=0, description="The cluster time a reuse saved: what the earlier attempt spent on it."
    )

    @property
    def seconds(self) -> float:
        return round((self.ended_at - self.started_at).total_seconds(), 3)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    @property
    def passed(self) -> bool:
        return self.verdict is not Verdict.FAIL


def failure_lines(findings: list[Finding], limit: int = 20) -> list[str]:
    """The failed findings as 'subject: check: detail' lines, at most `limit` and a count of the rest."""
    bad = [f"{f.subject}: {f.check}: {f.detail}" for f in findings if not f.ok]
    return bad[:limit] + ([f"… and {len(bad) - limit} more"] if len(bad) > limit else [])


def held(result: StageResult, nodes: int, started: datetime, reused: bool) -> StageResult:
    """`result` with the cluster time this run spent on it (wall time since `started` × `nodes`) and,
    when it was reused from an earlier attempt, the time that attempt spent: what the reuse saved."""
    spent = round((now() - started).total_seconds() * nodes, 1)
    saved = (result.node_seconds or round(result.seconds * nodes, 1)) if reused else 0.0
    return result.model_copy(update={"node_seconds": spent, "saved_node_seconds": saved})
