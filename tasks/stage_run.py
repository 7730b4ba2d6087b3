"""One way for a stage flow to collect its findings, publish its artifacts and end: StageRun.

Every stage publishes through `StageRun.publish` (its tables, then a Markdown summary under
`<stage>-summary`) and ends with `passed()` (a StageResult) or `failed()` (raises the stage's
StageFailed carrying the same StageResult), so the record and the UI always have the findings.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.logging import get_run_logger

from k3deploy.core.errors import K3DeployError, ServiceLost, StageFailed
from k3deploy.core.stage import FailureCause, FailureClass, Finding, StageResult, Verdict, failure_lines, now


class StageRun:
    """The findings, data and tables of one stage while it runs."""

    def __init__(self, stage: str, failure: type[StageFailed] = StageFailed) -> None:
        self.stage, self.failure = stage, failure
        self.started_at = now()
        self.findings: list[Finding] = []
        self.data: dict[str, Any] = {}
        self._tables: dict[str, tuple[list[dict[str, Any]], str]] = {}
        self._notes: list[str] = []
        self._sections: list[str] = []

    def table(self, name: str, rows: Sequence[dict[str, Any]], description: str = "") -> None:
        """A table artifact published with the verdict, keyed `<stage>-<name>`."""
        self._tables[f"{self.stage}-{name}"] = (list(rows), description)

    def note(self, line: str) -> None:
        """A line of the Markdown summary under the verdict."""
        self._notes.append(line)

    def section(self, title: str, markdown: str) -> None:
        """A titled part of the Markdown summary, after the notes (a node's last log lines, say)."""
        self._sections.append(f"## {title}\n\n{markdown}")

    def result(self, verdict: Verdict, reason: str = "", summary: str = "") -> StageResult:
        return StageResult(
            stage=self.stage,
            verdict=verdict,
            reason=reason,
            summary=summary,
            findings=list(self.findings),
            data=dict(self.data),
            started_at=self.started_at,
            ended_at=now(),
        )

    def publish(self, result: StageResult) -> StageResult:
        """Every table, then the summary: the verdict, the notes and the failed findings."""
        keys = []
        for key, (rows, description) in self._tables.items():
            if rows:
                create_table_artifact(rows, key=key, description=description or None)
                keys.append(key)
        head = f"# {self.stage}: {result.verdict.value.upper()}"
        lines = [head, "", *([result.summary, ""] if result.summary else [])]
        if result.reason:
            lines += [result.reason, ""]
        lines += [f"- {n}" for n in self._notes]
        bad = failure_lines(result.findings)
        if bad:
            lines += ["", "## Failed checks", "", *[f"- {b}" for b in bad]]
        lines += [f"\n{section}" for section in self._sections]
        summary_key = f"{self.stage}-summary"
        create_markdown_artifact("\n".join(lines) + "\n", key=summary_key, description=f"{self.stage} verdict")
        result.artifacts = [*keys, summary_key]
        return result

    def passed(self, summary: str = "") -> StageResult:
        """Publish and return the pass; any failed finding turns it into a failure."""
        if any(not f.ok for f in self.findings):
            self.failed(f"{sum(not f.ok for f in self.findings)} check(s) failed", summary)
        result = self.publish(self.result(Verdict.PASS, summary=summary))
        get_run_logger().info("%s passed in %.1f s%s", self.stage, result.seconds, f": {summary}" if summary else "")
        return result

    def not_applicable(self, reason: str) -> StageResult:
        return self.publish(self.result(Verdict.NOT_APPLICABLE, reason=reason))

    def failed(self, reason: str, summary: str = "", cause: FailureCause | None = None) -> NoReturn:
        """Publish the failure and raise the stage's StageFailed carrying the result, with its class and
        evidence: `cause` when the stage knows it, else its first failed finding's, else the stage's own."""
        result = self.result(Verdict.FAIL, reason=reason, summary=summary)
        result.failure = cause or self._cause(reason)
        raise self.failure(self.publish(result))

    def _cause(self, reason: str) -> FailureCause:
        default = FailureClass(self.failure.failure_class or FailureClass.ENGINE)
        bad = next((f for f in self.findings if not f.ok), None)
        if bad is None:
            return FailureCause(failure_class=default, evidence=reason)
        evidence = f"{bad.subject}: {bad.check}: {bad.detail}"
        return FailureCause(failure_class=bad.cause or default, evidence=evidence, node=bad.node)

    @contextlib.contextmanager
    def guard(self) -> Iterator[StageRun]:
        """Any project error inside becomes this stage's failure, with the findings gathered so far."""
        try:
            yield self
        except StageFailed:
            raise
        except ServiceLost as err:  # the stage's own finding: which rank was lost, how
            self.findings.append(Finding(f"{err.node} (DP rank {err.rank})", "serving", False, err.reason))
            self.data["service_lost"] = {"node": err.node, "rank": err.rank, "reason": err.reason}
            cause = FailureCause(failure_class=FailureClass(err.named or FailureClass.ENGINE), evidence=err.reason,
                                 node=err.node, dp_rank=err.rank, log_line=err.log_line, family=err.family)  # fmt: skip
            self.failed(str(err), cause=cause)
        except K3DeployError as err:
            self.failed(str(err), cause=error_cause(err, self.failure.failure_class))


def error_cause(err: K3DeployError, default: str | None) -> FailureCause:
    """An error's class (its own, else the stage's default) and the node it names, if any."""
    chosen = err.failure_class or default or FailureClass.ENGINE
    node = getattr(err, "node", None) or getattr(err, "host", None)
    evidence = str(err).removeprefix(f"{node}: ") if node else str(err)
    return FailureCause(failure_class=FailureClass(chosen), evidence=evidence, node=node)
