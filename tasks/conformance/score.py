"""The conformance suite's results scored by rule, mode and load, against the thresholds; without I/O.

A rule row is one finding: the cases it counts, those that failed, the rate, the limit and the first failing cases
(request id, mode, load, status and why). A failure seen under load and not alone is said to be so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from k3deploy.core.stage import FailureClass, Finding

ALONE, LOAD = "alone", "load"
EMPTY = ("empty", "empty-delta")


@dataclass(frozen=True)
class Result:
    """One case's answer judged: which case, sent how, what came back, the verdict."""

    case: str
    family: str
    mode: str  # whole | streamed
    load: str  # alone | load
    ok: bool
    status: str
    detail: str = ""
    cause: str | None = None
    keyword: str | None = None
    seconds: float = 0.0
    request: str = ""
    response: str = ""
    same: dict[str, Any] = field(default_factory=dict)  # what must match between the streamed and whole answers
    request_id: str = ""  # the X-Request-Id it was sent with: the engine's log lines about it carry it

    def where(self) -> str:
        return f"{self.case} ({self.mode}, {self.load})"


@dataclass(frozen=True)
class Limits:
    schema_accuracy: float = 1.0
    auto_tool_calls: float = 1.0
    max_empty_tool_calls: int = 0
    max_stream_differences: int = 0


@dataclass(frozen=True)
class Row:
    rule: str
    mode: str
    load: str
    cases: int
    failed: int
    limit: str
    ok: bool
    cause: str | None
    detail: str

    def finding(self) -> Finding:
        subject = f"{self.rule} ({self.mode}, {self.load})" if self.mode else f"{self.rule} ({self.load})"
        return Finding(subject, self.rule, self.ok, self.detail, FailureClass(self.cause) if self.cause else None)


def _failures(results: list[Result], only_under_load: set[tuple[str, str]], shown: int = 3) -> str:
    bad = [r for r in results if not r.ok]
    words = []
    for r in bad[:shown]:
        tag = " — only under load" if (r.case, r.mode) in only_under_load and r.load == LOAD else ""
        words.append(f"{r.case}: {r.status}: {r.detail}{tag}")
    more = f"; … {len(bad) - shown} more" if len(bad) > shown else ""
    keywords = Counter(r.keyword for r in bad if r.keyword)
    by_keyword = f" (by keyword: {', '.join(f'{k} ×{n}' for k, n in keywords.most_common())})" if keywords else ""
    return "; ".join(words) + more + by_keyword


def _rate_row(rule: str, mode: str, load: str, results: list[Result], floor: float,
              under_load: set[tuple[str, str]]) -> Row:  # fmt: skip
    """A rate against its floor; a failure is the engine's when any failed case was, else the model's."""
    good = sum(r.ok for r in results)
    engine = any(not r.ok and r.cause == FailureClass.ENGINE.value for r in results)
    cause = FailureClass.ENGINE.value if engine else FailureClass.MODEL.value
    rate = good / len(results) if results else 1.0
    ok = rate >= floor - 1e-9
    detail = f"{good}/{len(results)} valid ({rate:.1%}), at least {floor:.0%} asked"
    if good < len(results):
        detail += f": {_failures(results, under_load)}"
    return Row(
        rule, mode, load, len(results), len(results) - good, f">= {floor:.0%}", ok, None if ok else cause, detail
    )


def _count_row(rule: str, mode: str, load: str, judged: int, failed: list[Result], limit: int,
               under_load: set[tuple[str, str]], what: str = "failed") -> Row:  # fmt: skip
    ok = len(failed) <= limit
    detail = f"{len(failed)} of {judged} {what} (at most {limit} allowed)"
    if failed:
        detail += f": {_failures(failed, under_load)}"
    cause = next((r.cause for r in failed if r.cause), FailureClass.ENGINE.value)
    return Row(rule, mode, load, judged, len(failed), f"<= {limit}", ok, None if ok else cause, detail)


def differences(results: list[Result]) -> list[Result]:
    """Each case whose streamed answer differs from its whole one (same load), as a failed result naming the field."""
    pairs: dict[tuple[str, str], dict[str, Result]] = {}
    for r in results:
        if r.same:
            pairs.setdefault((r.case, r.load), {})[r.mode] = r
    out = []
    for (case, load), modes in sorted(pairs.items()):
        if set(modes) != {"whole", "streamed"}:
            continue
        whole, streamed = modes["whole"].same, modes["streamed"].same
        fields = [k for k in ("content", "reasoning", "calls") if whole.get(k) != streamed.get(k)]
        if fields:
            first = fields[0]
            detail = (f"{', '.join(fields)} differ: whole {str(whole.get(first))[:100]!r}, streamed "
                      f"{str(streamed.get(first))[:100]!r}")  # fmt: skip
            out.append(Result(case, modes["whole"].family, "both", load, False, "differs", detail, "engine"))
    return out


def score(results: list[Result], limits: Limits) -> list[Row]:
    """Every rule's rows, in the report's order."""
    alone = {(r.case, r.mode) for r in results if r.load == ALONE and r.ok}
    under_load = {(r.case, r.mode) for r in results if r.load == LOAD and not r.ok} & alone
    rows: list[Row] = []
    loads = [load for load in (ALONE, LOAD) if any(r.load == load for r in results)]

    def of(family: str, mode: str | None, load: str, keep: Callable[[Result], bool] = lambda r: True) -> list[Result]:
        return [r for r in results if r.family == family and r.load == load and (mode is None or r.mode == mode)
                and keep(r)]  # fmt: skip

    engine = lambda r: not r.ok and r.cause == FailureClass.ENGINE.value  # noqa: E731
    for load in loads:
        for mode in ("whole", "streamed"):
            forced = of("forced", mode, load)
            if forced:
                rows.append(_rate_row("schema accuracy", mode, load, forced, limits.schema_accuracy, under_load))
                rows.append(_count_row("forced calls well formed", mode, load, len(forced),
                                       [r for r in forced if engine(r)], 0, under_load))  # fmt: skip
            auto = of("auto", mode, load)
            if auto:
                rows.append(_rate_row("auto tool choice", mode, load, auto, limits.auto_tool_calls, under_load))
                rows.append(_count_row("auto calls well formed", mode, load, len(auto),
                                       [r for r in auto if engine(r)], 0, under_load))  # fmt: skip
            for family, rule in (
                ("choice", "tool_choice and response_format"),
                ("reasoning", "reasoning apart"),
                ("usage", "usage counted"),
                ("params", "parameters refused or accepted"),
            ):
                judged = of(family, mode, load)
                if judged:
                    rows.append(_count_row(rule, mode, load, len(judged), [r for r in judged if not r.ok], 0,
                                           under_load))  # fmt: skip
        mine = [r for r in results if r.load == load]
        empty = [r for r in mine if r.status in EMPTY]
        rows.append(_count_row("empty tool calls", "", load, sum(r.family in ("forced", "auto") for r in mine), empty,
                               limits.max_empty_tool_calls, under_load, "answers had one"))  # fmt: skip
        pairs = sum(1 for r in mine if r.same and r.mode == "whole")
        rows.append(_count_row("streamed = whole", "", load, pairs, differences(mine), limits.max_stream_differences,
                               under_load, "pairs differ"))  # fmt: skip
    return rows


def figures(results: list[Result], rows: list[Row]) -> dict[str, Any]:
    """The headline figures: cases, schema accuracy per mode and load, usage and parameter checks, failures."""
    accuracy = {f"{r.mode}/{r.load}": round((r.cases - r.failed) / r.cases, 4) for r in rows
                if r.rule == "schema accuracy" and r.cases}  # fmt: skip
    alone = {(r.case, r.mode) for r in results if r.load == ALONE and r.ok}
    only_load = sorted({f"{r.case} ({r.mode})" for r in results if r.load == LOAD and not r.ok and (r.case, r.mode)
                        in alone})  # fmt: skip
    usage = [r for r in results if r.family == "usage"]
    params = [r for r in results if r.family == "params"]
    return {
        "requests": len(results),
        "cases": len({(r.case, r.mode) for r in results}),
        "schema_accuracy": accuracy,
        "statuses": dict(Counter(r.status for r in results).most_common()),
        "usage_checks": {"checked": len(usage), "exact": sum(r.ok for r in usage)},
        "parameter_checks": {"checked": len(params), "as_due": sum(r.ok for r in params)},
        "failed_rules": [f"{r.rule} ({r.mode or 'pairs'}, {r.load})" for r in rows if not r.ok],
        "only_under_load": only_load,
    }


def as_dicts(results: list[Result]) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(r).items() if k != "same"} for r in results]
