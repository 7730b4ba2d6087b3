"""What a `vllm bench serve --save-result` JSON says, and how it compares with baselines (no I/O).

`failed` is in the saved JSON only from vLLM 0.12; before that it is `num_prompts − completed`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from k3deploy.blocks.bench import Baseline
from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks import metrics
from k3deploy.tasks.bench import consistency
from k3deploy.tasks.evidence import count, figure, finite, load_json_object

# The figures kept in the run record (others stay in the raw JSON beside it).
FIGURES = (
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    *(f"{stat}_{what}_ms" for what in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p99")),
)


# Always in a result of `vllm bench serve` that served anything; the summary and the history read them.
HEADLINE = ("duration", "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms")


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
    repeat: int = 1
    achieved_concurrency: float | None = None  # sum of request latencies / duration (Little's law)
    max_concurrency: int | None = None  # as the result says it was run (the plan's is the cell's concurrency)
    model_id: str | None = None  # the model the tool asked for
    output_tokens: int | None = None  # total_output_tokens: what the completed requests returned
    prefix_cache: dict[str, float] | None = None  # queries and hits (tokens) over the run, from /metrics
    # --save-detailed: each request's output tokens (0 for a failed one) and error ('' for a served one)
    output_lens: tuple[int, ...] | None = None
    errors: tuple[str, ...] = ()

    @property
    def error_counts(self) -> dict[str, int]:
        """The failed requests' errors, each distinct one with how many requests it ended."""
        counted: dict[str, int] = {}
        for error in self.errors:
            if error:
                counted[error] = counted.get(error, 0) + 1
        return counted

    @property
    def hit_rate(self) -> float | None:
        if self.prefix_cache is None or not self.prefix_cache.get("queries"):
            return None
        return self.prefix_cache["hits"] / self.prefix_cache["queries"]

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.completed == self.num_prompts


def required_figures(
    workload: str, concurrency: int, baselines: Iterable[Baseline], goodput: bool = False
) -> tuple[str, ...]:
    """What a run must report: the headline figures, every baseline's metric that applies to the run, and
    request_goodput when SLOs were given (--goodput)."""
    wanted = [b.metric for b in baselines if applies(b, workload, concurrency)]
    return tuple(dict.fromkeys([*HEADLINE, *wanted, *(["request_goodput"] if goodput else [])]))


def parse_result(text: str, workload: str, concurrency: int, required: Iterable[str] = HEADLINE) -> BenchRun:
    """The saved JSON of one run, strictly: a figure or count that is missing, not a number, NaN or ±infinite,
    a key given twice, or figures that cannot be together (tasks/bench/consistency.py) is an UnreadableResult
    (a ValueError) naming the key and the rule. Figures not required may be absent (vLLM leaves out
    percentiles not asked for), never malformed."""
    what = "the saved result"
    data = load_json_object(text, what)
    num_prompts, completed = count(data, "num_prompts", what), count(data, "completed", what)
    reported = "failed" in data
    failed = count(data, "failed", what) if reported else num_prompts - completed
    if failed < 0 or completed + failed > num_prompts:
        raise UnreadableEvidence(f"{what} counts {completed} completed and {failed} failed of {num_prompts} prompts")
    wanted = tuple(dict.fromkeys([*required]))
    absent = [k for k in wanted if data.get(k) is None]
    if absent:
        raise UnreadableEvidence(f"{what} lacks {', '.join(absent)}")
    keys = dict.fromkeys([*FIGURES, "request_goodput", *wanted])  # request_goodput is null without --goodput
    figures = {k: figure(data, k, what) for k in keys if data.get(k) is not None}
    consistency.check(data, completed, what)
    limit, model, tokens = data.get("max_concurrency"), data.get("model_id"), data.get("total_output_tokens")
    return BenchRun(workload, concurrency, num_prompts, completed, failed, reported, figures,
                    achieved_concurrency=_achieved_concurrency(data, what),
                    max_concurrency=count(data, "max_concurrency", what) if limit is not None else None,
                    model_id=model if isinstance(model, str) else None,
                    output_tokens=count(data, "total_output_tokens", what) if tokens is not None else None,
                    output_lens=tuple(data["output_lens"]) if "output_lens" in data else None,
                    errors=tuple(data.get("errors") or ()))  # fmt: skip


def _achieved_concurrency(data: dict[str, Any], what: str) -> float | None:
    """Requests in flight on average: the sum of their latencies over the run's duration; None without them."""
    latencies = data.get("latencies")
    if not isinstance(latencies, list) or not latencies:
        return None
    busy = sum(finite(v, f"{what}'s latency {i}") for i, v in enumerate(latencies))
    duration = figure(data, "duration", what)
    return round(busy / duration, 4) if duration > 0 else None


def parse_prefix_cache(text: str) -> dict[str, float]:
    """The `*.cache.json` beside a result: prefix-cache queries and hits over the run, finite and ≥ 0."""
    what = "the saved prefix-cache use"
    data = load_json_object(text, what)
    found = {key: figure(data, key, what) for key in ("queries", "hits")}
    if min(found.values()) < 0 or found["hits"] > found["queries"]:
        raise UnreadableEvidence(f"{what} counts {found['hits']:g} hits of {found['queries']:g} queries")
    return found


SPEC_COUNTS = {"drafts": "num_drafts", "draft_tokens": "num_draft_tokens", "accepted_tokens": "num_accepted_tokens"}
SPEC_RATES = ("acceptance_rate", "mean_acceptance_length")


def parse_acceptance(text: str) -> dict[str, Any]:
    """The `*.spec.json` beside a result: counts and rates, each a finite number (the rates may be null), or,
    for counters that could not be trusted, nulls and the `unreadable` reason."""
    what = "the saved acceptance"
    data = load_json_object(text, what)
    if "unreadable" in data:
        if not isinstance(data["unreadable"], str) or any(
            data.get(key) is not None for key in (*SPEC_COUNTS, *SPEC_RATES)
        ):
            raise UnreadableEvidence(f"{what} gives figures beside its reason for having none")
        return data
    for key in SPEC_COUNTS:
        figure(data, key, what)
    for key in SPEC_RATES:
        if data.get(key) is not None:
            figure(data, key, what)
    per_position = data.get("per_position")
    if per_position is not None:
        if not isinstance(per_position, list):
            raise UnreadableEvidence(f"{what}: per_position is {per_position!r}, not a list")
        for i, rate in enumerate(per_position):
            if not 0 <= finite(rate, f"{what}'s per_position[{i}]") <= 1:
                raise UnreadableEvidence(f"{what}: per_position[{i}] is {rate}, not a rate between 0 and 1")
    return data


@dataclass(frozen=True)
class Comparison:
    metric: str
    value: float | None
    baseline: float
    threshold: float
    ok: bool
    rule: str


def higher_is_better(metric: str) -> bool:
    return "throughput" in metric or "goodput" in metric


def applies(baseline: Baseline, workload: str, concurrency: int) -> bool:
    return baseline.workload == workload and baseline.concurrency in (None, concurrency)


def against_baselines(
    workload: str, concurrency: int, figures: dict[str, float], baselines: list[Baseline]
) -> list[Comparison]:
    """Each baseline that applies to this cell: throughput ≥ threshold × baseline, latency ≤ threshold × baseline."""
    out = []
    for b in baselines:
        if not applies(b, workload, concurrency):
            continue
        value = figures.get(b.metric)
        limit = b.threshold * b.value
        if higher_is_better(b.metric):
            ok, rule = value is not None and value >= limit, f"≥ {b.threshold:g} × {b.value:g} = {limit:g}"
        else:
            ok, rule = value is not None and value <= limit, f"≤ {b.threshold:g} × {b.value:g} = {limit:g}"
        out.append(Comparison(b.metric, value, b.value, b.threshold, ok, rule))
    return out


SPEC = "vllm:spec_decode_"
PREFIX_QUERIES, PREFIX_HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"


def prefix_cache(before: str, after: str) -> dict[str, float] | None:
    """Prefix-cache queries and hits (tokens, every engine) over a run, from /metrics before and after it;
    None when they cannot be read: no such counters (a reading failed), NaN, or counters that went down."""
    readings = [metrics.parse(text) for text in (before, after)]
    rises = []
    for name in (PREFIX_QUERIES, PREFIX_HITS):
        start, end = (metrics.total(r, name) for r in readings)
        if start is None or end is None or not math.isfinite(end - start) or end < start:
            return None  # absent, NaN, or a counter that went down (a server restarted): unknown, never 0 %
        rises.append(end - start)
    if rises[1] > rises[0]:
        return None
    return {"queries": rises[0], "hits": rises[1]}


def acceptance(before: str, after: str) -> dict[str, Any] | None:
    """Speculative decoding over a run, from the change of the spec_decode counters; None without a draft
    (no such counters after the run). Counters that are there but cannot be trusted — one missing, not read
    before the run, NaN, gone down (a server restarted), more accepted than proposed — give no figures and
    an `unreadable` reason, so the cell is invalid rather than credited with a made-up acceptance.

    acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts.
    """
    readings = [metrics.parse(text) for text in (before, after)]
    ends = {key: metrics.total(readings[1], f"{SPEC}{name}_total") for key, name in SPEC_COUNTS.items()}
    if all(value is None for value in ends.values()):
        return None
    starts = {key: metrics.total(readings[0], f"{SPEC}{name}_total") for key, name in SPEC_COUNTS.items()}
    rises = {key: end - start for key, end in ends.items() if (start := starts[key]) is not None and end is not None}
    if len(rises) < len(SPEC_COUNTS):
        gone = [f"{SPEC}{SPEC_COUNTS[key]}_total" for key in SPEC_COUNTS if key not in rises]
        return _unknown_acceptance(f"no reading of {', '.join(gone)} before and after the run")
    if not all(math.isfinite(value) for value in rises.values()):
        return _unknown_acceptance(f"spec_decode counters read NaN or infinite: {rises}")
    if min(rises.values()) < 0:
        return _unknown_acceptance(f"spec_decode counters went down over the run (a server restarted): {rises}")
    drafts, draft_tokens, accepted = rises["drafts"], rises["draft_tokens"], rises["accepted_tokens"]
    if accepted > draft_tokens or (draft_tokens and not drafts):
        return _unknown_acceptance(f"spec_decode counters that cannot be: {rises}")
    return {
        **rises,
        "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else None,
        "per_position": _per_position(readings, drafts),
    }


def _per_position(readings: list[list[metrics.Sample]], drafts: float) -> list[float] | None:
    """Acceptance per draft position (accepted there / drafts), as vLLM's own log shows it; None when the
    per-position counter is absent or does not add up."""
    name = f"{SPEC}num_accepted_tokens_per_pos_total"
    rises: dict[int, float] = {}
    for i, reading in enumerate(readings):
        for sample in reading:
            position = sample.labels.get("position", "")
            if sample.name == name and position.isdigit():
                rises[int(position)] = rises.get(int(position), 0.0) + sample.value * (1 if i else -1)
    if not drafts or not rises or sorted(rises) != list(range(len(rises))):
        return None
    if not all(math.isfinite(v) and 0 <= v <= drafts for v in rises.values()):
        return None
    return [round(rises[p] / drafts, 4) for p in range(len(rises))]


def _unknown_acceptance(reason: str) -> dict[str, Any]:
    return dict.fromkeys((*SPEC_COUNTS, *SPEC_RATES)) | {"unreadable": reason}
