"""Regression verdicts: a run's bench and accuracy figures against its baselines and its own history.

Pure functions over run records. A figure is judged against the run-to-run spread of the last
passing runs of the same config family: within the spread is not a regression, however much it
moved; beyond everything seen before is, and then the verdict names what changed in provenance
(image, versions, checkpoint commits, config keys) since the last pass.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from k3deploy.blocks.bench import Baseline
from k3deploy.core.stage import FailureClass
from k3deploy.records.record import RunRecord
from k3deploy.tasks.bench.results import HEADLINE, against_baselines, higher_is_better

MIN_HISTORY = 3  # fewer earlier passes than this: no spread to judge by
MAD_FACTOR = 3.0  # tolerance = MAD_FACTOR × 1.4826 × MAD (a robust 3 sigma) ...
RELATIVE_FLOOR = 0.03  # ... but never tighter than 3 % of the median
# The figures judged against history: throughputs and mean latencies. A p99 over a bench's few dozen
# prompts is the worst one or two of them, and inter-token gaps are scheduler jitter: on the recorded
# history (tests/data/history) they alone swung beyond every earlier run with nothing changed. They stay in
# the record and the report's tables, and a `bench.baselines` entry still judges any of them.
BENCH_METRICS = (
    "output_throughput",
    "request_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_e2el_ms",
    "request_goodput",  # with bench.slo only
    "mean_output_tokens",  # without --ignore-eos only: judged by LENGTH_TOLERANCE both ways, not as a speed
)
OUTPUT_LENGTH = "mean_output_tokens"
CAPACITY = "capacity"  # the capacity search's answer, a figure of its own: "capacity at p99 TTFT ≤ 2000 ms, …"
CAPACITY_ANSWERS = ("found", "ceiling", "saturated")  # a search that ran out of probes or minutes is a bound only
LENGTH_TOLERANCE = 0.10  # MLPerf Inference TEST09: the mean output length within ±10 % of the reference
# What defines "the same deployment" across runs; everything else a regression may be blamed on.
FAMILY_KEYS = (
    "cluster.nodes",
    "models.target.repo",
    "serve.served_model_name",
    "serve.data_parallel_size",
    "serve.tensor_parallel_size",
    "serve.expert_parallel_size",
    "bench.random_input_len",
    "bench.random_output_len",
    "bench.num_prompts",
)
# credentials, how we log in, who is told of a run
IGNORED_KEYS = ("cluster.ssh", "image.registry", "models.hub_token", "alerts")


class RegressionVerdict(StrEnum):
    PASS = "PASS"
    REGRESSED = "REGRESSED"
    MISSING = "MISSING"  # history or a baseline has the figure, the run does not: never a pass
    INCONCLUSIVE = "INCONCLUSIVE"


@dataclass(frozen=True)
class Figure:
    key: str  # "bench random c4 output_throughput", "accuracy lm_eval k3_arith exact_match"
    value: float  # a cell's median over its runs
    higher_is_better: bool
    best: float | None = None  # the best of the cell's runs, when it ran more than once
    floor: float = 0.0  # a change this small is never a regression (the capacity search's resolution)


@dataclass(frozen=True)
class MetricVerdict:
    key: str
    value: float | None  # None: MISSING
    verdict: RegressionVerdict
    reason: str
    median: float | None = None
    low: float | None = None  # the band a value may fall in without being a regression
    high: float | None = None
    history: tuple[float, ...] = ()


@dataclass(frozen=True)
class Comparison:
    run_id: str
    family: str
    verdict: RegressionVerdict
    metrics: list[MetricVerdict]
    history_runs: list[str]  # the earlier passing runs judged against, oldest first
    changes: list[str] = field(default_factory=list)  # provenance changed since the last pass
    last_pass: str | None = None
    unreadable: list[str] = field(default_factory=list)  # records of the store left out: "path: why"
    why: str | None = None  # why the verdict is not the figures' (a run failed by its site or its tool)

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "family": self.family,
            "verdict": self.verdict.value,
            "history_runs": self.history_runs,
            "last_pass": self.last_pass,
            "changes": self.changes,
            "unreadable": self.unreadable,
            "why": self.why,
            "metrics": [m.__dict__ | {"verdict": m.verdict.value, "history": list(m.history)} for m in self.metrics],
        }


def _get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)  # type: ignore[assignment]
    return data


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{"serve": {"max_num_seqs": 4}} → {"serve.max_num_seqs": 4}; lists stay values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def family(record: RunRecord) -> str:
    """Short hash of what makes runs comparable: the nodes, the model, the topology, the bench shape."""
    picked = {key: _get(record.config, key) for key in FAMILY_KEYS}
    blob = json.dumps(picked, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def bench_cells(record: RunRecord) -> list[dict[str, Any]]:
    """The run's bench cells as recorded (tasks/bench/cells.Cell); a record from before cells: one per run."""
    bench = record.stage("bench")
    if bench is None:
        return []
    if "cells" in bench.data:
        return list(bench.data["cells"])
    return [run | {"valid": True, "reasons": [], "spread": {}, "repeats": 1} for run in bench.data.get("runs", [])]


def figures(record: RunRecord) -> dict[str, Figure]:
    """Every tracked figure of a run: bench metrics of each VALID cell (an invalid one is no evidence), scores."""
    out: dict[str, Figure] = {}
    for c in bench_cells(record):
        if not c["valid"]:
            continue
        for metric in BENCH_METRICS:
            value = c.get("figures", {}).get(metric)
            if isinstance(value, int | float):
                key = f"bench {c['workload']} c{c['concurrency']} {metric}"
                better = higher_is_better(metric)
                spread = c.get("spread", {}).get(metric) if c.get("repeats", 1) > 1 else None
                best = (max(spread) if better else min(spread)) if spread else None
                out[key] = Figure(key, float(value), better, best)
    capacity = record.capacity
    if capacity is not None and capacity.ending in CAPACITY_ANSWERS:
        key = f"{CAPACITY} at {capacity.slo}"
        out[key] = Figure(key, float(capacity.concurrency), True, floor=float(capacity.resolution))
    accuracy = record.stage("accuracy")
    for score in accuracy.data.get("scores", []) if accuracy else []:
        key = f"accuracy {score['evaluator']} {score['dataset']} {score['metric']}"
        out[key] = Figure(key, float(score["score"]), True)
    return out


def provenance(record: RunRecord) -> dict[str, str]:
    """What a regression can be blamed on: image, versions, checkpoint commits, every config key."""
    out: dict[str, str] = {}
    if record.image is not None:
        out["image digest"] = record.image.digest or record.image.image_id
        out |= {f"{name} version": v for name, v in sorted(record.image.versions.items())}
        if record.image.source_revision:
            out["image source revision"] = record.image.source_revision
    out |= {f"{c.role} checkpoint commit": c.commit for c in record.checkpoints}
    for key, value in flatten(record.config).items():
        if not key.startswith(IGNORED_KEYS) and key not in FAMILY_KEYS:
            out[f"config {key}"] = json.dumps(value, default=str)
    return out


def changes_between(before: RunRecord, after: RunRecord) -> list[str]:
    """'what: old → new' for every provenance item that differs."""
    old, new = provenance(before), provenance(after)
    return [
        f"{k}: {old.get(k, '(none)')} → {new.get(k, '(none)')}"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    ]


def judge(figure: Figure, history: Sequence[float]) -> MetricVerdict:
    """One figure against the same figure in earlier passing runs (oldest first)."""
    if len(history) < MIN_HISTORY:
        why = f"only {len(history)} earlier passing run(s) with this figure; {MIN_HISTORY} needed to know its spread"
        return MetricVerdict(figure.key, figure.value, RegressionVerdict.INCONCLUSIVE, why, history=tuple(history))
    median = statistics.median(history)
    mad = statistics.median(abs(v - median) for v in history)
    tolerance = max(MAD_FACTOR * 1.4826 * mad, RELATIVE_FLOOR * abs(median), figure.floor)
    low, high = median - tolerance, median + tolerance
    worse = (median - figure.value) if figure.higher_is_better else (figure.value - median)
    worst_seen = min(history) if figure.higher_is_better else max(history)
    change = (figure.value - median) / median * 100 if median else 0.0
    past = tuple(history)
    if worse <= tolerance:
        why = f"{change:+.1f} % from the median of {len(history)} runs, within their spread (±{tolerance:.4g})"
        return MetricVerdict(figure.key, figure.value, RegressionVerdict.PASS, why, median, low, high, past)
    beyond = figure.value < worst_seen if figure.higher_is_better else figure.value > worst_seen
    if beyond and figure.best is not None:
        best_worse = (median - figure.best) if figure.higher_is_better else (figure.best - median)
        if best_worse <= tolerance:  # the run's own spread reaches back into history's
            why = (f"{change:+.1f} % from the median, worse than every earlier run, but its best repeat "
                   f"({figure.best:.4g}) is within their spread")  # fmt: skip
            return MetricVerdict(figure.key, figure.value, RegressionVerdict.INCONCLUSIVE, why, median, low, high, past)
    if beyond:
        why = f"{change:+.1f} % from the median, worse than every one of {len(history)} earlier runs ({worst_seen:.4g})"
        return MetricVerdict(figure.key, figure.value, RegressionVerdict.REGRESSED, why, median, low, high, past)
    why = f"{change:+.1f} % from the median, outside the spread but not beyond the worst earlier run ({worst_seen:.4g})"
    return MetricVerdict(figure.key, figure.value, RegressionVerdict.INCONCLUSIVE, why, median, low, high, past)


def judge_length(figure: Figure, history: Sequence[float], baseline: Figure | None) -> MetricVerdict:
    """The mean output length (measured without --ignore-eos) against the baseline run's, else history's median:
    beyond ±10 % either way the run answered differently, and its speed is not comparable — a server that cuts
    answers short is not faster. Never a pass then."""
    if baseline is not None:
        reference, source = baseline.value, "the baseline run's"
    elif len(history) >= MIN_HISTORY:
        reference, source = statistics.median(history), f"the median of {len(history)} earlier runs'"
    else:
        why = f"only {len(history)} earlier passing run(s) with this figure and no baseline run"
        return MetricVerdict(figure.key, figure.value, RegressionVerdict.INCONCLUSIVE, why, history=tuple(history))
    change = (figure.value - reference) / reference if reference else 0.0
    within = abs(change) <= LENGTH_TOLERANCE
    why = f"{figure.value:.4g} tokens a request, {change:+.1%} from {source} {reference:.4g}: " + (
        "within ±10 %" if within else "beyond ±10 %: answers of another length, its speed is not comparable"
    )
    verdict = RegressionVerdict.PASS if within else RegressionVerdict.REGRESSED
    low, high = reference * (1 - LENGTH_TOLERANCE), reference * (1 + LENGTH_TOLERANCE)
    return MetricVerdict(figure.key, figure.value, verdict, why, reference, low, high, tuple(history))


def judge_baseline(figure: Figure, value: float, threshold: float, source: str) -> MetricVerdict:
    """A figure against a fixed baseline: ≥ threshold × value (throughput, scores), ≤ (latency)."""
    bound = threshold * value
    ok = figure.value >= bound if figure.higher_is_better else figure.value <= bound
    side = "≥" if figure.higher_is_better else "≤"
    why = f"{figure.value:.4g} {'meets' if ok else 'misses'} {source}: {side} {threshold:g} × {value:.4g} = {bound:.4g}"
    return MetricVerdict(figure.key, figure.value, RegressionVerdict.PASS if ok else RegressionVerdict.REGRESSED, why)


def comparable(record: RunRecord, candidates: Iterable[RunRecord], last: int) -> list[RunRecord]:
    """The last `last` passing runs of the same family that started before `record`, oldest first."""
    mine = family(record)
    earlier = [
        r
        for r in candidates
        if r.run_id != record.run_id and r.verdict == "pass" and r.started_at < record.started_at and family(r) == mine
    ]
    return sorted(earlier, key=lambda r: r.started_at)[-last:] if last > 0 else []


def headline_keys(record: RunRecord) -> set[str]:
    """The judged figures every valid bench cell reports (tasks/bench/results.HEADLINE): absent is damage."""
    cells = [(c["workload"], c["concurrency"]) for c in bench_cells(record) if c["valid"]]
    return {f"bench {w} c{c} {m}" for w, c in cells for m in BENCH_METRICS if m in HEADLINE}


def invalid_cells(record: RunRecord) -> list[MetricVerdict]:
    """Each INVALID cell of the run as a MISSING verdict: its figures are not evidence, and never a pass."""
    out = []
    for c in bench_cells(record):
        if not c["valid"]:
            why = "the cell is INVALID: " + "; ".join(c.get("reasons", []))
            out.append(
                MetricVerdict(f"bench {c['workload']} c{c['concurrency']}", None, RegressionVerdict.MISSING, why)
            )
    return out


def missing(have: dict[str, Figure], expected: dict[str, str]) -> list[MetricVerdict]:
    """A MISSING verdict for each expected figure (key → who has it) that the run's figures lack."""
    return [
        MetricVerdict(key, None, RegressionVerdict.MISSING, f"the run has no such figure; {who} has it")
        for key, who in sorted(expected.items())
        if key not in have
    ]


def not_about_performance(record: RunRecord) -> bool:
    """A run failed by its site or its measuring tool says nothing of the deployment's speed: never REGRESSED."""
    return record.failure is not None and record.failure.failure_class in (
        FailureClass.INFRASTRUCTURE,
        FailureClass.TOOL,
    )


def not_measured(record: RunRecord) -> str | None:
    """Why a run has no figures at all when it failed before bench ran (None: it measured, or could have): its
    figures were never measured, which is not the same as figures that vanished from a run that measured."""
    if record.failed_stage is None or record.failed_stage == "bench" or bench_cells(record):
        return None
    cause = f" ({record.failure.failure_class.value})" if record.failure is not None else ""
    return f"failed at {record.failed_stage}{cause} before bench: its figures were not measured"


def compare(
    record: RunRecord,
    candidates: Iterable[RunRecord],
    last: int = 10,
    baseline: RunRecord | None = None,
    unreadable: Sequence[str] = (),
) -> Comparison:
    """The run's figures against the config's baselines, an optional baseline run and its history; a figure
    those have and the run lacks is MISSING."""
    history = comparable(record, candidates, last)
    if (unmeasured := not_measured(record)) is not None:  # said once, not as every figure MISSING
        return Comparison(run_id=record.run_id, family=family(record), verdict=RegressionVerdict.INCONCLUSIVE,
                          metrics=[], history_runs=[r.run_id for r in history], changes=[],
                          last_pass=history[-1].run_id if history else None, unreadable=list(unreadable),
                          why=unmeasured)  # fmt: skip
    series = [figures(r) for r in history]
    base_figures = figures(baseline) if baseline is not None else {}
    have = figures(record)
    # a capacity is judged against earlier answers at the same SLOs; a run that did not search (not asked), searched
    # at other SLOs or ran out of probes is not missing one (the capacity stage's own verdict covers its failures)
    held_by = Counter(key for s in series for key in s if key in have or not key.startswith(CAPACITY))
    expected = {key: "every bench cell" for key in headline_keys(record)}
    expected |= {key: f"{n} earlier passing run(s)" for key, n in held_by.items()}
    expected |= {key: f"baseline run {baseline.run_id[:8]}" for key in base_figures
                 if baseline is not None and (key in have or not key.startswith(CAPACITY))}  # fmt: skip
    verdicts: list[MetricVerdict] = invalid_cells(record) + missing(have, expected)
    for key, figure in sorted(have.items()):
        if key.endswith(OUTPUT_LENGTH):
            verdicts.append(judge_length(figure, [s[key].value for s in series if key in s], base_figures.get(key)))
            continue
        verdicts.append(judge(figure, [s[key].value for s in series if key in s]))
        if key in base_figures:
            spread = verdicts[-1]
            factor = 1 + RELATIVE_FLOOR if not figure.higher_is_better else 1 - RELATIVE_FLOOR
            if spread.median:
                factor = (spread.low if figure.higher_is_better else spread.high) / spread.median  # type: ignore[operator]
            if figure.floor and base_figures[key].value:  # within one step of the baseline run's answer
                factor = min(factor, 1 - figure.floor / base_figures[key].value)
            verdicts.append(
                judge_baseline(figure, base_figures[key].value, factor, f"baseline run {baseline.run_id[:8]}")  # type: ignore[union-attr]
            )
    verdicts += _config_baselines(record)
    found = {v.verdict for v in verdicts}
    overall = next(
        (
            v
            for v in (RegressionVerdict.REGRESSED, RegressionVerdict.MISSING, RegressionVerdict.INCONCLUSIVE)
            if v in found
        ),
        RegressionVerdict.PASS,
    )
    why = None
    if not_about_performance(record) and record.failure is not None:
        overall = RegressionVerdict.INCONCLUSIVE
        why = (f"failed at {record.failed_stage} by its {record.failure.failure_class.value}, "
               "which says nothing of the deployment's speed")  # fmt: skip
    elif not verdicts:
        overall = RegressionVerdict.INCONCLUSIVE
    last_pass = history[-1] if history else None
    changes = changes_between(last_pass, record) if last_pass is not None else []
    if overall is RegressionVerdict.REGRESSED and last_pass is not None and not changes:
        changes = [f"nothing in the provenance changed since run {last_pass.run_id}: look at the nodes themselves"]
    return Comparison(
        run_id=record.run_id,
        family=family(record),
        verdict=overall,
        metrics=verdicts,
        history_runs=[r.run_id for r in history],
        changes=changes,
        last_pass=last_pass.run_id if last_pass else None,
        unreadable=list(unreadable),
        why=why,
    )


def _config_baselines(record: RunRecord) -> list[MetricVerdict]:
    """The run's own `bench.baselines`, judged by the bench stage's rule (tasks/bench/results.compare)."""
    baselines = [Baseline.model_validate(b) for b in _get(record.config, "bench.baselines") or []]
    out = []
    for cell in bench_cells(record) if baselines else []:
        if not cell["valid"]:
            continue  # named once, by invalid_cells
        for c in against_baselines(cell["workload"], cell["concurrency"], cell["figures"], baselines):
            key = f"bench {cell['workload']} c{cell['concurrency']} {c.metric}"
            if c.value is None:
                why = f"the run has no such figure; bench.baselines has it: {c.rule}"
                out.append(MetricVerdict(key, None, RegressionVerdict.MISSING, why))
                continue
            why = f"{c.value:.4g} {'meets' if c.ok else 'misses'} bench.baselines: {c.rule}"
            out.append(
                MetricVerdict(key, c.value, RegressionVerdict.PASS if c.ok else RegressionVerdict.REGRESSED, why)
            )
    return out
