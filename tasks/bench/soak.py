"""The soak's judgement, without I/O: each window (one bench run of steady load) as it ends, and the drift of the
whole soak at its end.

A window fails the soak at once when any request failed or the run is otherwise no evidence (the bench's rules).
At the end, the last `drift.windows` windows are set against the first ones: latency (the median of their p50 TTFT
and p50 end-to-end latency) higher, or output throughput lower, by more than the stated tolerance is drift; a rank's
memory growing, over the windows after the first (the first warms the allocators up), at a least-squares slope
that would take all the memory still free on its node (or its NPUs' HBM) within `drift.memory_horizon_hours` is a
leak, once it grew by more than `drift.memory_noise_mb` in all.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from k3deploy.blocks.soak import SoakDrift
from k3deploy.tasks.bench.cells import Cell

MIB = 1024 * 1024
# TTFT, and the whole request's latency rather than TPOT: a CPU vLLM's stream may deliver a request's tokens in one
# chunk, leaving its TPOT near zero and its TTFT long (seen on the local profile), while its E2EL stays what it was
LATENCIES = (("median_ttft_ms", "median TTFT"), ("median_e2el_ms", "median E2EL"))
THROUGHPUT = "output_throughput"
KEPT = (THROUGHPUT, "request_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_tpot_ms", "p99_tpot_ms", "median_e2el_ms", "p99_e2el_ms")  # fmt: skip


@dataclass(frozen=True)
class Window:
    """One window of steady load, judged as it ended."""

    index: int  # from 1
    ended_at: float  # seconds since the epoch: when its run ended and its memory was read
    seconds: float
    completed: int
    num_prompts: int
    valid: bool
    reasons: list[str]
    figures: dict[str, float] = field(default_factory=dict)
    achieved_concurrency: float | None = None
    # rank ("local1 (DP rank 1)") → {"bytes": the server's memory, "free": the node's MemAvailable, "hbm_used",
    # "hbm_total": its NPUs' HBM in bytes}; a value is None where the node does not say
    memory: dict[str, dict[str, int | None]] = field(default_factory=dict)
    resumed: bool = False

    def line(self) -> str:
        """'window 3: 24/24 requests, 310 tok/s, p50 TTFT 120 ms, p50 E2EL 410 ms'."""
        f = self.figures
        shown = [f"{self.completed}/{self.num_prompts} requests"]
        shown += [f"{f[THROUGHPUT]:.4g} tok/s"] if THROUGHPUT in f else []
        shown += [f"{label.replace('median', 'p50')} {f[key]:.4g} ms" for key, label in LATENCIES if key in f]
        return f"window {self.index}: " + ", ".join(shown)


def window_of(index: int, c: Cell, ended_at: float, seconds: float, memory: dict[str, dict[str, int | None]],
              resumed: bool) -> Window:  # fmt: skip
    keep = {k: v for k, v in c.figures.items() if k in KEPT}
    return Window(index, ended_at, round(seconds, 3), c.completed, c.num_prompts, c.valid, list(c.reasons), keep,
                  c.achieved_concurrency, memory, resumed)  # fmt: skip


def window_failure(w: Window) -> str | None:
    """Why this window fails the soak at once (a failed request, a run that is no evidence), else None."""
    if w.valid:
        return None
    return f"window {w.index}: " + "; ".join(w.reasons)


@dataclass(frozen=True)
class DriftRow:
    """One drift check of the whole soak: what, per rank where it applies, its verdict and its figures."""

    check: str
    subject: str
    ok: bool
    detail: str
    judged: bool = True  # False: too few windows to judge (a flag, never a failure)


def drift(windows: list[Window], conf: SoakDrift) -> list[DriftRow]:
    """Latency and throughput of the last windows against the first ones; each rank's memory slope."""
    return [*_speed(windows, conf), *_memory(windows, conf)]


def _speed(windows: list[Window], conf: SoakDrift) -> list[DriftRow]:
    n = conf.windows
    if len(windows) < 2 * n:
        why = f"{len(windows)} window(s): {2 * n} needed to set the last {n} against the first {n}"
        return [DriftRow("latency drift", "soak", True, why, judged=False),
                DriftRow("throughput drift", "soak", True, why, judged=False)]  # fmt: skip
    first, last = windows[:n], windows[-n:]
    span = f"windows {last[0].index}–{last[-1].index} against {first[0].index}–{first[-1].index}"
    rows = []
    for key, label in LATENCIES:
        before, after = _median(first, key), _median(last, key)
        if before is None or after is None:
            rows.append(DriftRow("latency drift", label, True, f"{key} not in every window's result", judged=False))
            continue
        change = after / before - 1 if before else 0.0
        ok = change <= conf.latency
        said = (f"{label} {after:.4g} ms in {span}'s {before:.4g} ms: {change:+.1%}, "
                f"{'within' if ok else 'beyond'} soak.drift.latency {conf.latency:.0%}")  # fmt: skip
        rows.append(DriftRow("latency drift", label, ok, said))
    before, after = _median(first, THROUGHPUT), _median(last, THROUGHPUT)
    if before and after is not None:
        change = after / before - 1
        ok = change >= -conf.throughput
        said = (f"output throughput {after:.4g} tok/s in {span}'s {before:.4g} tok/s: {change:+.1%}, "
                f"{'within' if ok else 'beyond'} soak.drift.throughput −{conf.throughput:.0%}")  # fmt: skip
        rows.append(DriftRow("throughput drift", "output throughput", ok, said))
    return rows


def _median(windows: list[Window], key: str) -> float | None:
    values = [w.figures[key] for w in windows if key in w.figures]
    return statistics.median(values) if len(values) == len(windows) else None


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (time s, bytes): bytes a second."""
    mean_t = statistics.fmean(t for t, _ in points)
    mean_b = statistics.fmean(b for _, b in points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (b - mean_b) for t, b in points) / spread if spread else 0.0


def _memory(windows: list[Window], conf: SoakDrift) -> list[DriftRow]:
    ranks = sorted({rank for w in windows for rank in w.memory})
    rows = []
    for rank in ranks:
        for kind, used, room in (("memory", "bytes", "free"), ("NPU HBM", "hbm_used", "hbm_total")):
            rows += _leak(rank, kind, windows, used, room, conf)
    return rows


def _leak(rank: str, kind: str, windows: list[Window], used: str, room: str, conf: SoakDrift) -> list[DriftRow]:
    """One rank's memory (or HBM) over the windows after the first: its slope, and when it would run out."""
    readings = [(w.ended_at, w.memory.get(rank, {}).get(used), w.memory.get(rank, {}).get(room)) for w in windows]
    known = [(t, float(b), r) for t, b, r in readings if b is not None]
    if not known:
        return []
    if len(known) < 3:
        return [DriftRow(f"{kind} growth", rank, True, f"{len(known)} reading(s): 3 needed for a slope", judged=False)]
    after_warmup = known[1:]
    rate = slope([(t, b) for t, b, _ in after_warmup])
    grown = known[-1][1] - known[0][1]
    last_room = known[-1][2]
    headroom = None if last_room is None else (last_room - known[-1][1] if kind == "NPU HBM" else last_room)
    per_hour = rate * 3600
    said = (f"{known[-1][1] / MIB:.0f} MiB at window {windows[-1].index}, {grown / MIB:+.0f} MiB since window "
            f"{windows[0].index}, slope {per_hour / MIB:+.1f} MiB/h over windows "
            f"{windows[1].index}–{windows[-1].index}")  # fmt: skip
    if grown <= conf.memory_noise_mb * MIB or rate <= 0:
        return [DriftRow(f"{kind} growth", rank, True, f"{said}: steady (below soak.drift.memory_noise_mb "
                                                        f"{conf.memory_noise_mb:g} MiB or not rising)")]  # fmt: skip
    if headroom is None:
        return [DriftRow(f"{kind} growth", rank, True, f"{said}; the memory still free is unknown here", judged=False)]
    hours = headroom / per_hour
    ok = hours >= conf.memory_horizon_hours
    gone = (
        f"the {headroom / MIB:.0f} MiB still free would be gone in {hours:.1f} h, "
        f"{'beyond' if ok else 'within'} soak.drift.memory_horizon_hours {conf.memory_horizon_hours:g}"
    )
    return [DriftRow(f"{kind} growth", rank, ok, f"{said}: {gone}")]


def figures(windows: list[Window], rows: list[DriftRow], planned_minutes: float) -> dict[str, Any]:
    """The soak's headline for the record: how far it got and what drifted."""
    spent = sum(w.seconds for w in windows)
    return {
        "windows": len(windows),
        "minutes": round(spent / 60, 2),
        "planned_minutes": planned_minutes,
        "requests": sum(w.completed for w in windows),
        "resumed_windows": sum(w.resumed for w in windows),
        "drifted": [f"{r.check}: {r.subject}" for r in rows if not r.ok],
        "not_judged": [f"{r.check}: {r.subject}" for r in rows if not r.judged],
    }
