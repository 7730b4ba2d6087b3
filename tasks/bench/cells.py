"""Bench cells: one workload at one concurrency, run `bench.repeats` times, judged VALID or INVALID (no I/O).

A cell is valid when it measured what it claims to: every request served; the prefix cache as the
workload means it (cold: served from no warm cache; prefix hits: hits); the concurrency asked for
reached. Its figures are the medians of its runs, with their spread (min, max). A percentile over fewer
requests than `tail_requests` asks at `bench.validity.tail_confidence` is not known: flagged, and invalid
when a baseline judges it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from k3deploy.blocks.bench import Baseline, Validity
from k3deploy.tasks.bench.results import BenchRun, Comparison, applies

OUTPUT_LENGTH = "mean_output_tokens"  # a cell's figure without --ignore-eos: what the answers' length was


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
    acceptance_reference: float | None = None  # the draft's expected mean acceptance length (None: not judged)


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
        errors = sorted(run.error_counts.items(), key=lambda item: -item[1])
        said = "".join(f"; {n} × {' '.join(error.split())[:200]!r}" for error, n in errors[:3])  # the tool's words
        done = f"{run.completed} of {run.num_prompts} requests completed, {run.failed} failed"
        out.append(f"{tag}: {done}{counted}{said}")
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
        out.extend(f"{tag}: {reason}" for reason in _below_reference(run.speculative, serving, validity))
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
    if serving.output_len is not None and run.completed:
        ratio = serving.range_ratio if run.workload != "prefix_repetition" else 0
        out += _short_outputs(run, serving.output_len, ratio)
    return out


def _short_outputs(run: BenchRun, asked: int, ratio: float) -> list[str]:
    """With --ignore-eos every served request returns the tokens asked (a range with --random-range-ratio):
    per request where the result keeps each one's length (--save-detailed), else by the total."""
    low, high = math.floor(asked * (1 - ratio)), math.ceil(asked * (1 + ratio))
    asked_words = f"{low}" if low == high else f"{low}–{high}"
    served = None
    if run.output_lens is not None and len(run.errors) == len(run.output_lens):
        served = [n for n, error in zip(run.output_lens, run.errors, strict=True) if not error]
    if served is not None:
        short, long = [n for n in served if n < low], [n for n in served if n > high]
        if not short and not long:
            return []
        said = [f"{len(short)} of {len(served)} served requests returned fewer tokens than the {asked_words} "
                f"--ignore-eos asked (bench.random_output_len {asked}; shortest {min(short)}, short by "
                f"{sum(low - n for n in short)} tokens in all)"] if short else []  # fmt: skip
        if long:
            said.append(f"{len(long)} of {len(served)} served requests returned more than the {asked_words} asked "
                        f"(longest {max(long)})")  # fmt: skip
        return [f"{'; '.join(said)}: a server that cuts answers short is not faster"]
    if run.output_tokens is None:
        return []
    low_total, high_total = run.completed * low, run.completed * high
    if low_total <= run.output_tokens <= high_total:
        return []
    range_words = f"{low_total}" if low_total == high_total else f"{low_total}–{high_total}"
    how = f"short by {low_total - run.output_tokens}" if run.output_tokens < low_total else "more than asked"
    return [f"{run.output_tokens} output tokens from {run.completed} completed requests where --ignore-eos asked "
            f"{range_words} (bench.random_output_len {asked}): {how}; a server that cuts answers short is not "
            "faster"]  # fmt: skip


def _acceptance_reasons(speculative: dict[str, Any] | None) -> list[str]:
    if speculative is None:
        return ["no spec_decode counters on /metrics: whether the draft was used is unknown"]
    if speculative.get("unreadable"):
        return [f"the draft's acceptance is unknown: {speculative['unreadable']}"]
    if not speculative.get("draft_tokens"):
        return ["the draft proposed no tokens over the run: the speculative server was not measured"]
    return []


def _below_reference(speculative: dict[str, Any] | None, serving: Serving, validity: Validity) -> list[str]:
    """A draft accepting less than its reference curve says for this many speculative tokens: the cell measured
    a server that does not speculate as deployed (a wrong draft, a broken proposer), not the DSpark deployment."""
    reference = serving.acceptance_reference
    measured = (speculative or {}).get("mean_acceptance_length")
    if reference is None or measured is None:
        return []
    floor = reference * (1 - validity.acceptance_tolerance)
    if measured >= floor:
        return []
    return [f"mean acceptance length {measured:g}, below the reference {reference:g} by more than "
            f"bench.validity.acceptance_tolerance {validity.acceptance_tolerance:.0%} (at least {floor:.4g}; "
            "bench.speculative_reference)"]  # fmt: skip


def tail_requests(percentile: float, confidence: float) -> int:
    """The fewest requests from which the `percentile`-th percentile is known at `confidence`: n draws all fall
    below the true percentile with chance (p/100)^n, so n ≥ ln(1 − confidence) / ln(p/100) leaves at least one
    request above it with that confidence (the zero-failure case of MLPerf's early-stopping bound)."""
    return math.ceil(math.log(1 - confidence) / math.log(percentile / 100) - 1e-9)


def unknown_tails(figures: dict[str, float], requests: int, confidence: float) -> list[tuple[str, int]]:
    """Each percentile the figures report (p50, p90, p99, …) that too few requests stand behind, with how many
    it needs."""
    out = []
    for name in sorted({k.split("_", 1)[0][1:] for k in figures if k.startswith("p") and "_" in k}, key=float):
        need = tail_requests(float(name), confidence)
        if requests < need:
            out.append((name, need))
    return out


def cell(runs: list[BenchRun], validity: Validity, serving: Serving, baselines: list[Baseline]) -> Cell:
    """The runs of one workload and concurrency (repeat order) judged as one cell."""
    first = runs[0]
    reasons = [reason for run in runs for reason in run_reasons(run, validity, serving)]
    flags: list[str] = []
    fewest = min(run.completed for run in runs)
    for percentile, need in unknown_tails(first.figures, fewest, validity.tail_confidence):
        judged = sorted({b.metric for b in baselines if applies(b, first.workload, first.concurrency)
                         and b.metric.startswith(f"p{percentile}_")})  # fmt: skip
        said = (f"p{percentile} figures from {fewest} requests are not known: {need} are needed at "
                f"bench.validity.tail_confidence {validity.tail_confidence:.0%}")  # fmt: skip
        (reasons if judged else flags).append(said + (f", and a baseline judges {', '.join(judged)}" if judged else ""))
    keys = [k for k in first.figures if all(k in run.figures for run in runs)]
    figures = {k: round(statistics.median(run.figures[k] for run in runs), 6) for k in keys}
    spread = {k: [min(run.figures[k] for run in runs), max(run.figures[k] for run in runs)] for k in keys}
    lengths = [run.output_tokens / run.completed for run in runs if run.output_tokens is not None and run.completed]
    if serving.output_len is None and len(lengths) == len(runs):  # without --ignore-eos: the answers' own length
        figures[OUTPUT_LENGTH] = round(statistics.median(lengths), 6)
        spread[OUTPUT_LENGTH] = [min(lengths), max(lengths)]
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
