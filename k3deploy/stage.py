"""The stage contract: what every stage returns, whether it passed or not (DESIGN.md, "The stage contract").

`validate`, the CLI, the run record and the report read only these types, so a new stage needs
no code anywhere but its own flow and one line in the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIPPED = "skipped"
    NOT_APPLICABLE = "not-applicable"


@dataclass(frozen=True)
class Finding:
    """One row of what a stage checked: the subject (a node, 'node1 NPU 3', a checkpoint, a request),
    the check, the outcome, and the value seen or what is wrong and where."""

    subject: str
    check: str
    ok: bool
    detail: str = ""


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
    started_at: datetime = Field(default_factory=now)
    ended_at: datetime = Field(default_factory=now)

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
