"""Bench cells: one workload at one concurrency, run `bench.repeats` times, judged VALID or INVALID (no I/O).

A cell is valid when it measured what it claims to: every request served; the prefix cache as the
workload means it (cold: served from no warm cache; prefix hits: hits); the concurrency asked for
reached. Its figures are the medians of its runs, with their spread (min, max). A p99 over fewer
requests than `bench.validity.tail_min_requests` is their maximum, not a tail: flagged, and
invalid when a baseline judges it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from k3deploy.blocks.bench import Baseline, Validity
from k3deploy.tasks.bench.results import BenchRun, Comparison, applies


@dataclass(frozen=True)
class Serving:
    """What the measured server was started with, and what the bench plan asked of it, as far as judging a
    cell needs them."""

    prefix_caching: bool
    drafting: bool  # served with a speculative draft: each run must show how much of it was accepted
    num_prompts: int | None = None  # the plan's --num-prompts (None: not judged)
    model: str | None = None  # the served model name the plan's --model names
    output_len: int | None = None  # with --ignore-eos: the tokens each request must return (None: not judged)
    range_ratio: float = 0.0  # --random-range-ratio: the random workload's lengths vary by this much


@dataclass(frozen=True)
class Cell:
    workload: str
    concurrency: int
    repeats: int
    valid: bool
    reasons: list[str]  # why it is invalid, one per problem and run
    flags: list[str]  # what to read with care, without making it invalid
    completed: int  # over every run
    num_prompts: int
    hit_rate: float | None  # median over the runs: prefix-cache hits / queries (tokens)
    achieved_concurrency: float | None  # median over the runs
    figures: dict[str, float] = field(default_factory=dict)  # medians over the runs
    spread: dict[str, list[float]] = field(default_factory=dict)  # figure → [min, max] over the runs


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def run_reasons(run: BenchRun, validity: Validity, serving: Serving) -> list[str]:
    """What keeps one run from counting: failed requests, the wrong cache state, concurrency not reached,
    a draft whose acceptance is unknown."""
    out, tag = [], f"run {run.repeat}"
    out += [f"{tag}: {said}" for said in not_as_planned(run, serving)]
    prefix_caching = serving.prefix_caching
    if not run.ok:
        counted = "" if run.failed_reported else " (num_prompts − completed: this vLLM reports no failed)"
        out.append(f"{tag}: {run.completed} of {run.num_prompts} requests completed, {run.failed} failed{counted}")
    rate = run.hit_rate
    if run.workload == "prefix_repetition":
        if not prefix_caching:
            out.append(f"{tag}: prefix caching is off (serve.enable_prefix_caching): the prefix-hit workload "
                       "measures nothing it claims")  # fmt: skip
        elif rate is None:
            out.append(f"{tag}: no prefix-cache counters on /metrics: whether the prefixes were hit is unknown")
        elif rate < validity.prefix_min_hit_rate:
            out.append(f"{tag}: prefix-cache hit rate {rate:.1%} on the prefix-hit workload, below "
                       f"bench.validity.prefix_min_hit_rate {validity.prefix_min_hit_rate:.0%}")  # fmt: skip
    elif prefix_caching:
        if rate is None:
            out.append(f"{tag}: no prefix-cache counters on /metrics: whether the cache was cold is unknown")
        elif rate > validity.cold_max_hit_rate:
            out.append(f"{tag}: prefix-cache hit rate {rate:.1%} on the cold workload, above "
                       f"bench.validity.cold_max_hit_rate {validity.cold_max_hit_rate:.0%}: served from a warm cache "
                       "(bench.reset_prefix_cache resets it before each run)")  # fmt: skip
    if serving.drafting:
        out.extend(f"{tag}: {reason}" for reason in _acceptance_reasons(run.speculative))
    wanted = min(run.concurrency, run.num_prompts)
    got = run.achieved_concurrency
    if got is None:
        out.append(f"{tag}: no request latencies in the result: the concurrency reached is unknown")
    elif got < validity.min_concurrency_ratio * wanted:
        out.append(f"{tag}: achieved concurrency {got:.2f} of {wanted} requested, below "
                   f"bench.validity.min_concurrency_ratio {validity.min_concurrency_ratio:g}: the client or the "
                   "server saturated")  # fmt: skip
    return out


def not_as_planned(run: BenchRun, serving: Serving) -> list[str]:
    """Where the result says it ran other than planned: fewer or more prompts, another concurrency, another
    model. Counts that agree with each other are no proof the run was the one asked for."""
    out = []
    if serving.num_prompts is not None and run.num_prompts != serving.num_prompts:
        out.append(f"the result ran {run.num_prompts} prompts where the plan asked {serving.num_prompts} "
                   "(bench.num_prompts): not the run planned")  # fmt: skip
    if run.max_concurrency is not None and run.max_concurrency != run.concurrency:
        out.append(f"the result ran at max_concurrency {run.max_concurrency}, the cell's is {run.concurrency}")
    if serving.model is not None and run.model_id is not None and run.model_id != serving.model:
        out.append(f"the result asked model {run.model_id!r}, the service is {serving.model!r}")
    if serving.output_len is not None and run.output_tokens is not None and run.completed:
        ratio = serving.range_ratio if run.workload != "prefix_repetition" else 0.0
        low = run.completed * math.floor(serving.output_len * (1 - ratio))
        high = run.completed * math.ceil(serving.output_len * (1 + ratio))
        if not low <= run.output_tokens <= high:
            asked = f"{low}" if low == high else f"{low}–{high}"
            out.append(f"{run.output_tokens} output tokens from {run.completed} completed requests where --ignore-eos "
                       f"asked {asked} (bench.random_output_len {serving.output_len}): "
                       f"{'short by ' + str(low - run.output_tokens) if run.output_tokens < low else 'more than asked'}"
                       "; a server that cuts answers short is not faster")  # fmt: skip
    return out


def _acceptance_reasons(speculative: dict[str, Any] | None) -> list[str]:
    if speculative is None:
        return ["no spec_decode counters on /metrics: whether the draft was used is unknown"]
    if speculative.get("unreadable"):
        return [f"the draft's acceptance is unknown: {speculative['unreadable']}"]
    if not speculative.get("draft_tokens"):
        return ["the draft proposed no tokens over the run: the speculative server was not measured"]
    return []


def cell(runs: list[BenchRun], validity: Validity, serving: Serving, baselines: list[Baseline]) -> Cell:
    """The runs of one workload and concurrency (repeat order) judged as one cell."""
    first = runs[0]
    reasons = [reason for run in runs for reason in run_reasons(run, validity, serving)]
    flags: list[str] = []
    fewest = min(run.completed for run in runs)
    if fewest < validity.tail_min_requests:
        judged = sorted({b.metric for b in baselines if applies(b, first.workload, first.concurrency)
                         and b.metric.startswith("p99")})  # fmt: skip
        said = (f"p99 figures from {fewest} requests are their maximum, not a tail "
                f"(bench.validity.tail_min_requests {validity.tail_min_requests})")  # fmt: skip
        (reasons if judged else flags).append(said + (f", and a baseline judges {', '.join(judged)}" if judged else ""))
    keys = [k for k in first.figures if all(k in run.figures for run in runs)]
    figures = {k: round(statistics.median(run.figures[k] for run in runs), 6) for k in keys}
    spread = {k: [min(run.figures[k] for run in runs), max(run.figures[k] for run in runs)] for k in keys}
    return Cell(
        first.workload, first.concurrency, len(runs), not reasons, reasons, flags,
        sum(run.completed for run in runs), sum(run.num_prompts for run in runs),
        _median([run.hit_rate for run in runs]), _median([run.achieved_concurrency for run in runs]),
        figures, spread,
    )  # fmt: skip


def summary(c: Cell) -> str:
    """One line of what the cell measured and how far to trust it."""
    rate = "unknown" if c.hit_rate is None else f"{c.hit_rate:.1%}"
    reached = "unknown" if c.achieved_concurrency is None else f"{c.achieved_concurrency:.2f}"
    said = (f"{'VALID' if c.valid else 'INVALID'}: {c.completed}/{c.num_prompts} requests over {c.repeats} run(s), "
            f"prefix-cache hit rate {rate}, achieved concurrency {reached} of {c.concurrency}")  # fmt: skip
    return "; ".join([said, *c.reasons])


def with_spread(c: Cell, metric: str) -> str | None:
    """'median (min–max)' over a cell's runs; the median alone for one run."""
    if metric not in c.figures:
        return None
    low, high = c.spread[metric]
    return f"{c.figures[metric]:.4g}" + (f" ({low:.4g}–{high:.4g})" if c.repeats > 1 else "")


def row(c: Cell, comparisons: list[Comparison], resumed: str, speculative: dict[str, Any] | None) -> dict[str, Any]:
    """The cell as a row of the stage's `runs` table."""
    return {
        "workload": c.workload,
        "concurrency": c.concurrency,
        "valid": "VALID" if c.valid else "INVALID",
        "runs": c.repeats,
        "completed": f"{c.completed}/{c.num_prompts}",
        "prefix hit rate": None if c.hit_rate is None else round(c.hit_rate, 4),
        "achieved concurrency": c.achieved_concurrency,
        "output tok/s": with_spread(c, "output_throughput"),
        "mean TTFT ms": with_spread(c, "mean_ttft_ms"),
        "mean TPOT ms": with_spread(c, "mean_tpot_ms"),
        "p99 E2EL ms": c.figures.get("p99_e2el_ms"),
        "goodput req/s": c.figures.get("request_goodput"),
        "acceptance": (speculative or {}).get("acceptance_rate"),
        "baselines": "; ".join(f"{x.metric} {'ok' if x.ok else 'MISSED'}" for x in comparisons) or "-",
        "why": "; ".join(c.reasons + c.flags) or "-",
        "resumed": resumed,
    }
