"""The capacity search, without I/O: each probe (one bench run at one concurrency) judged against the SLOs, and
where the search goes next.

The search doubles the concurrency from `capacity.start` while every SLO holds, then bisects between the highest
concurrency that held and the lowest that did not, until they are `capacity.resolution` apart. It stops early, and
says why, when the server over-saturates — a probe that cannot reach the concurrency asked, requests that waited
in the engine's queue (its own counters) for more than `capacity.queue_share` of their median TTFT, or a median
TTFT that grows faster than the concurrency by more than `capacity.ttft_growth`; no probe runs above that one —
when a probe is no evidence (failed requests, the tool's own failure), at the ceiling (`max_concurrency`), or when
its bounds (probes, minutes) are spent. The answer is the highest concurrency that held,
with the probes just below and above it as its evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from k3deploy.blocks.capacity import CapacityConfig, CapacitySlo
from k3deploy.tasks import metrics
from k3deploy.tasks.bench.cells import Cell, tail_requests

Ending = Literal["found", "ceiling", "saturated", "nothing holds", "invalid probe", "probes spent", "minutes spent"]
CONCURRENCY_REASON = "achieved concurrency"  # the words of cells.run_reasons for a concurrency not reached
MEDIAN_TTFT = "median_ttft_ms"  # vllm bench's p50, always in its result
QUEUE = "vllm:request_queue_time_seconds"  # the engine's histogram of the time a request waited for a slot
QUEUE_MS = "mean_queue_ms"  # a probe's figure: that wait per request, from the counters around its run


@dataclass(frozen=True)
class Probe:
    """One concurrency measured and judged: does every SLO hold, did the server over-saturate, why."""

    concurrency: int
    holds: bool | None  # None: no evidence either way (an invalid run)
    why: str  # the SLO figures against their limits, or what makes it no evidence
    saturated: str | None = None  # why the server is past saturation here (no probe above it runs)
    figures: dict[str, float] = field(default_factory=dict)  # the SLO's figures, the median TTFT, throughput
    completed: int = 0
    num_prompts: int = 0
    seconds: float = 0.0
    resumed: bool = False

    @property
    def outcome(self) -> str:
        said = "holds" if self.holds else "breaks" if self.holds is False else "invalid"
        return f"{said}, saturated" if self.saturated else said


@dataclass(frozen=True)
class Answer:
    """Where the search ended and what it found."""

    concurrency: int  # the highest that held (0: none did)
    ending: Ending
    why: str
    below: Probe | None = None  # the probe at the answer
    above: Probe | None = None  # the lowest probe above it that did not hold (None: none ran)

    @property
    def passed(self) -> bool:
        return self.ending not in ("invalid probe", "nothing holds")


def probe_prompts(concurrency: int, conf: CapacityConfig, confidence: float) -> int:
    """Prompts of a probe: c × prompts_per_concurrency, and enough for the SLO's percentile to be a figure."""
    return max(concurrency * conf.prompts_per_concurrency, tail_requests(conf.slo.percentile, confidence))


def percentile_key(slo: CapacitySlo, metric: str) -> str:
    """vllm bench's saved key for the SLO's percentile of a metric: p99_ttft_ms, p99.9_tpot_ms."""
    return f"p{slo.percentile:g}_{metric}_ms"


def queue_wait_ms(before: str, after: str) -> float | None:
    """The mean time a request of the run waited in the engines' queues (ms), from /metrics read around it: the
    histogram's sum and count moved by the run's requests. None when vLLM does not report it."""
    parsed = metrics.parse(before), metrics.parse(after)
    sums = [metrics.total(p, f"{QUEUE}_sum") for p in parsed]
    counts = [metrics.total(p, f"{QUEUE}_count") for p in parsed]
    if None in sums or None in counts or counts[1] - counts[0] <= 0:  # type: ignore[operator]
        return None
    return round((sums[1] - sums[0]) / (counts[1] - counts[0]) * 1000, 3)  # type: ignore[operator]


def slo_figures(c: Cell, slo: CapacitySlo) -> dict[str, float]:
    """The figures the SLOs judge, named as vllm bench names them; goodput as a fraction of completed requests."""
    out = {k: c.figures[k] for k in (percentile_key(slo, "ttft"), percentile_key(slo, "tpot"), MEDIAN_TTFT,
                                     "mean_ttft_ms", "output_throughput") if k in c.figures}  # fmt: skip
    good, done = c.figures.get("request_goodput"), c.figures.get("request_throughput")
    if good is not None and done:
        out["goodput_fraction"] = round(good / done, 4)
    if c.achieved_concurrency is not None:
        out["achieved_concurrency"] = c.achieved_concurrency
    return out


def broken(figures: dict[str, float], slo: CapacitySlo) -> tuple[list[str], list[str]]:
    """(what holds, what breaks), each 'p99 TTFT 812 ms ≤ 2000 ms'; a figure the run lacks breaks its SLO."""
    held: list[str] = []
    broke: list[str] = []
    checks: list[tuple[str, str, float | None, bool]] = [
        ("TTFT", percentile_key(slo, "ttft"), slo.ttft_ms, False),
        ("TPOT", percentile_key(slo, "tpot"), slo.tpot_ms, False),
        ("goodput", "goodput_fraction", slo.goodput, True),
    ]
    for name, key, limit, at_least in checks:
        if limit is None:
            continue
        value = figures.get(key)
        label = name if name == "goodput" else f"p{slo.percentile:g} {name}"
        if value is None:
            broke.append(f"{label}: not in the result ({key})")
            continue
        ok = value >= limit if at_least else value <= limit
        shown = f"{value:.1%} ≥ {limit:.0%}" if at_least else f"{value:.4g} ms ≤ {limit:g} ms"
        if not ok:
            shown = shown.replace("≥", "<") if at_least else shown.replace("≤", ">")
        (held if ok else broke).append(f"{label} {shown}")
    return held, broke


def judge(c: Cell, conf: CapacityConfig, below: Probe | None, seconds: float = 0.0, resumed: bool = False,
          queue_ms: float | None = None) -> Probe:  # fmt: skip
    """One probe's cell against the SLOs; `below` is the nearest lower probe that measured a median TTFT (for the
    growth of TTFT with concurrency); `queue_ms` the mean wait in the engines' queues during the run."""
    figures = slo_figures(c, conf.slo) | ({QUEUE_MS: queue_ms} if queue_ms is not None else {})
    common: dict[str, Any] = {"figures": figures, "completed": c.completed, "num_prompts": c.num_prompts,
                              "seconds": round(seconds, 3), "resumed": resumed}  # fmt: skip
    if not c.valid:
        short = [r for r in c.reasons if CONCURRENCY_REASON in r]
        if short and len(short) == len(c.reasons):  # the concurrency asked was not reached: saturation, no evidence
            return Probe(c.concurrency, None, "; ".join(short), saturated=short[0], **common)
        return Probe(c.concurrency, None, "; ".join(c.reasons), **common)
    held, broke = broken(figures, conf.slo)
    why = "; ".join(broke or held)
    return Probe(c.concurrency, not broke, why, saturated=_queueing(figures, c.concurrency, below, conf), **common)


def _queueing(figures: dict[str, float], concurrency: int, below: Probe | None, conf: CapacityConfig) -> str | None:
    """Over-saturation: requests waited in the engine's queue for a large share of their TTFT (the engine's own
    counters), or the median TTFT grows faster than the concurrency by more than ttft_growth."""
    ttft = figures.get(MEDIAN_TTFT, figures.get("mean_ttft_ms"))
    waited = figures.get(QUEUE_MS)
    if waited is not None and ttft and waited > conf.queue_share * ttft:
        return (f"requests waited {waited:.4g} ms each on average in the engines' queues at concurrency {concurrency} "
                f"({QUEUE}), {waited / ttft:.0%} of the median TTFT {ttft:.4g} ms, above capacity.queue_share "
                f"{conf.queue_share:.0%}: they wait for a slot")  # fmt: skip
    if below is None or ttft is None:
        return None
    before = below.figures.get(MEDIAN_TTFT, below.figures.get("mean_ttft_ms"))
    if not before or below.concurrency >= concurrency:
        return None
    ttft_ratio, load_ratio = ttft / before, concurrency / below.concurrency
    growth = ttft_ratio / load_ratio
    if growth <= conf.ttft_growth:
        return None
    return (f"median TTFT {ttft:.4g} ms at concurrency {concurrency} is {ttft_ratio:.2f} × its {before:.4g} ms at "
            f"{below.concurrency}, for {load_ratio:.2f} × the concurrency: it grows {growth:.2f} × as fast, above "
            f"capacity.ttft_growth {conf.ttft_growth:g} (requests queue for a slot)")  # fmt: skip


def nearest_below(probes: list[Probe], concurrency: int) -> Probe | None:
    """The highest probe under `concurrency` that measured a median TTFT (the base of its growth)."""
    lower = [p for p in probes if p.concurrency < concurrency and p.holds is not None]
    return max(lower, key=lambda p: p.concurrency, default=None)


def bracket(probes: list[Probe]) -> tuple[Probe | None, Probe | None]:
    """(the highest probe that held below the lowest that did not, that lowest one); a probe that over-saturated
    without evidence counts as not holding."""
    failing = [p for p in probes if p.holds is False or (p.holds is None and p.saturated)]
    above = min(failing, key=lambda p: p.concurrency, default=None)
    held = [p for p in probes if p.holds and (above is None or p.concurrency < above.concurrency)]
    return max(held, key=lambda p: p.concurrency, default=None), above


def next_step(probes: list[Probe], conf: CapacityConfig, minutes: float) -> int | Answer:
    """The next concurrency to probe, or the Answer once the search has ended."""
    below, above = bracket(probes)
    lo = below.concurrency if below else 0

    def end(ending: Ending, why: str) -> Answer:
        return Answer(lo, ending, why, below, above)

    invalid = next((p for p in probes if p.holds is None and not p.saturated), None)
    if invalid is not None:
        return end("invalid probe", f"the probe at concurrency {invalid.concurrency} is no evidence: {invalid.why}")
    saturated = min((p for p in probes if p.saturated), key=lambda p: p.concurrency, default=None)
    if not probes:
        return conf.start
    if above is not None and above.concurrency - lo <= conf.resolution:
        if lo == 0:
            return end("nothing holds", f"no concurrency holds the SLOs: at {above.concurrency}, {above.why}")
        return end("found", f"holds at {lo}, not at {above.concurrency}: {above.why}")
    if saturated is not None and (above is None or saturated.concurrency <= above.concurrency):
        return end("saturated", f"over-saturated at concurrency {saturated.concurrency}, so no probe above it ran: "
                                f"{saturated.saturated}")  # fmt: skip
    if len(probes) >= conf.max_probes:
        return end("probes spent", f"capacity.max_probes {conf.max_probes} probes run" + _between(lo, above))
    if minutes >= conf.max_minutes:
        return end("minutes spent", f"capacity.max_minutes {conf.max_minutes:g} spent" + _between(lo, above))
    if above is None:  # every probe so far held: double
        if lo >= conf.max_concurrency:
            return end("ceiling", f"holds at capacity.max_concurrency {conf.max_concurrency}, the search's ceiling")
        return min(max(lo * 2, conf.start), conf.max_concurrency)
    return (lo + above.concurrency) // 2


def _between(lo: int, above: Probe | None) -> str:
    if above is None:
        return f"; it held up to {lo}, nothing above was probed"
    return f"; it holds at {lo}, not at {above.concurrency}: the capacity is between them"


def answer_line(answer: Answer, slo: CapacitySlo) -> str:
    """'holds 12 concurrent at p99 TTFT ≤ 2000 ms, p99 TPOT ≤ 50 ms, goodput ≥ 95 %' and how the search ended."""
    if answer.concurrency == 0:
        return f"holds no concurrency at {slo.describe()} ({answer.ending})"
    return f"holds {answer.concurrency} concurrent at {slo.describe()} ({answer.ending})"
