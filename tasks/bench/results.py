"""What a `vllm bench serve --save-result` JSON says, and how it compares with baselines (no I/O).

`failed` is in the saved JSON only from vLLM 0.12; before that it is `num_prompts − completed`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from k3deploy.blocks.bench import Baseline
from k3deploy.errors import K3DeployError
from k3deploy.tasks import metrics

# The figures kept in the run record (others stay in the raw JSON beside it).
FIGURES = (
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(f"{stat}_{what}_ms" for what in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")),
)


class UnreadableResult(K3DeployError, ValueError):
    """The saved JSON is not a result of `vllm bench serve`; the message names what is missing or wrong."""


@dataclass(frozen=True)
class BenchRun:
    """One workload at one concurrency."""

    workload: str
    concurrency: int
    num_prompts: int
    completed: int
    failed: int
    failed_reported: bool  # the JSON has `failed` (vLLM ≥ 0.12); else it is num_prompts − completed
    figures: dict[str, float] = field(default_factory=dict)
    speculative: dict[str, Any] | None = None  # draft acceptance over the run (with a DSpark draft)
    tool_seconds: float | None = None  # wall time of `vllm bench serve` itself, start-up included

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.completed == self.num_prompts


def parse_result(text: str, workload: str, concurrency: int) -> BenchRun:
    """The saved JSON of one run; UnreadableResult (a ValueError) naming what is missing when it is not one."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise UnreadableResult(f"the saved result is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise UnreadableResult("the saved result is not a JSON object")
    missing = [k for k in ("num_prompts", "completed") if not isinstance(data.get(k), int)]
    if missing:
        raise UnreadableResult(f"the saved result lacks {', '.join(missing)}")
    reported = isinstance(data.get("failed"), int)
    failed = int(data["failed"]) if reported else int(data["num_prompts"]) - int(data["completed"])
    figures = {}
    for k in FIGURES:
        if isinstance(data.get(k), int | float):
            try:
                figures[k] = float(data[k])
            except OverflowError:  # an integer beyond any float
                raise UnreadableResult(f"the saved result's {k} is out of range ({len(str(data[k]))} digits)") from None
    return BenchRun(workload, concurrency, int(data["num_prompts"]), int(data["completed"]), failed, reported, figures)


@dataclass(frozen=True)
class Comparison:
    metric: str
    value: float | None
    baseline: float
    threshold: float
    ok: bool
    rule: str


def higher_is_better(metric: str) -> bool:
    return "throughput" in metric


def compare(run: BenchRun, baselines: list[Baseline]) -> list[Comparison]:
    """Each baseline that applies to this run: throughput ≥ threshold × baseline, latency ≤ threshold × baseline."""
    out = []
    for b in baselines:
        if b.workload != run.workload or (b.concurrency is not None and b.concurrency != run.concurrency):
            continue
        value = run.figures.get(b.metric)
        limit = b.threshold * b.value
        if higher_is_better(b.metric):
            ok, rule = value is not None and value >= limit, f"≥ {b.threshold:g} × {b.value:g} = {limit:g}"
        else:
            ok, rule = value is not None and value <= limit, f"≤ {b.threshold:g} × {b.value:g} = {limit:g}"
        out.append(Comparison(b.metric, value, b.value, b.threshold, ok, rule))
    return out


SPEC = "vllm:spec_decode_"


def acceptance(before: str, after: str) -> dict[str, Any] | None:
    """Speculative decoding over a run, from the change of the spec_decode counters; None without a draft.

    acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts.
    """
    readings = [metrics.parse(text) for text in (before, after)]

    def rise(name: str) -> float | None:
        values = [metrics.total(r, f"{SPEC}{name}_total") for r in readings]
        return None if values[1] is None else values[1] - (values[0] or 0.0)

    drafts, draft_tokens, accepted = rise("num_drafts"), rise("num_draft_tokens"), rise("num_accepted_tokens")
    if drafts is None or draft_tokens is None or accepted is None:
        return None
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
    }
