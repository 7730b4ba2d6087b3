"""Whether a `vllm bench serve` result is physically possible and adds up (no I/O).

Missing, NaN and infinite figures are refused by the parser; these are the figures that are numbers but
cannot be: a negative time, a run of no duration, a throughput of nothing beside completed requests,
percentiles out of order, a rate that is not its count over the duration, a first token after the last one,
a request longer than the whole run. Each violation names the figure and the rule; the result is then not
evidence (the bench tool's problem, never a pass). The rules and their sources: docs/bench.md, "What makes a
bench cell VALID".
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from k3deploy.core.errors import UnreadableEvidence

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p50", "p90", "p95", "p99", "p99.9")
ORDERED = ("p50", "p90", "p95", "p99", "p99.9")  # the percentiles vLLM reports, in the order they must hold
RATE_TOLERANCE = 0.01  # a throughput against its count over the duration (vLLM computes it so: float rounding only)
ROUNDING = 1e-6  # relative slack for comparisons of figures computed from the same samples


def _slack(value: float) -> float:
    return abs(value) * ROUNDING + 1e-9


def violations(data: dict[str, Any], completed: int) -> list[str]:
    """Every rule the result's figures break, each naming the figure (empty: possible and consistent).
    `data` holds finite numbers where it holds numbers (the parser has refused the rest)."""

    def num(key: str) -> float | None:
        value = data.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    out: list[str] = []
    duration = num("duration")
    for what in LATENCIES:
        for stat in STATS:
            value = num(f"{stat}_{what}_ms")
            if value is not None and value < 0:
                out.append(f"{stat}_{what}_ms is {value:g}: a time is never negative")
        present = [(p, v) for p in ORDERED if (v := num(f"{p}_{what}_ms")) is not None]
        for (low, a), (high, b) in pairwise(present):
            if a > b + _slack(b):
                out.append(f"{low}_{what}_ms {a:g} is above {high}_{what}_ms {b:g}: percentiles are ordered")
        median, p50 = num(f"median_{what}_ms"), num(f"p50_{what}_ms")
        if median is not None and p50 is not None and abs(median - p50) > _slack(median) + 1e-6:
            out.append(f"median_{what}_ms {median:g} is not p50_{what}_ms {p50:g}: they are one figure")
        if duration is not None and duration > 0:
            central = [v for s in ("mean", "median") if (v := num(f"{s}_{what}_ms")) is not None]
            longest = max([*central, *(v for p, v in present)], default=None)
            if longest is not None and longest > duration * 1000 * (1 + ROUNDING) + 1e-6:
                out.append(f"{what} of {longest:g} ms in a run of {duration:g} s: no request outlasts the run")
    for stat in ("mean", "median", *ORDERED):
        ttft, e2el = num(f"{stat}_ttft_ms"), num(f"{stat}_e2el_ms")
        if ttft is not None and e2el is not None and ttft > e2el + _slack(e2el):
            out.append(f"{stat}_ttft_ms {ttft:g} is above {stat}_e2el_ms {e2el:g}: a first token comes before the end")
    if completed == 0:
        return out
    if duration is None or duration <= 0:
        out.append(f"duration is {duration:g} s with {completed} completed requests: a run that served takes time"
                   if duration is not None else "duration is missing beside completed requests")  # fmt: skip
        return out
    for key, counted in (
        ("request_throughput", completed),
        ("output_throughput", num("total_output_tokens")),
        ("total_token_throughput", _sum(num("total_input_tokens"), num("total_output_tokens"))),
    ):
        value = num(key)
        if value is None or counted is None:
            continue
        expected = counted / duration
        if value <= 0 and counted > 0:
            out.append(f"{key} is {value:g} beside {completed} completed requests: something was served")
        elif abs(value - expected) > RATE_TOLERANCE * expected + 1e-9:
            out.append(f"{key} {value:g} is not {counted:g} / duration {duration:g} s = {expected:g} "
                       f"(within {RATE_TOLERANCE:.0%})")  # fmt: skip
    out += _per_request(data, completed)
    latencies = data.get("latencies")
    if isinstance(latencies, list):
        for i, seconds in enumerate(latencies):
            if isinstance(seconds, int | float) and not 0 <= seconds <= duration * (1 + ROUNDING) + 1e-6:
                out.append(f"latencies[{i}] is {seconds:g} s in a run of {duration:g} s")
                break
    return out


def _per_request(data: dict[str, Any], completed: int) -> list[str]:
    """With --save-detailed, the per-request lists must be the run's: one entry per prompt, the errors those of
    the failed requests, the output lengths adding up to total_output_tokens (vLLM sums exactly these)."""
    lens, errors = data.get("output_lens"), data.get("errors")
    if lens is None and errors is None:
        return []
    if not isinstance(lens, list) or not isinstance(errors, list):
        return ["output_lens and errors come together with --save-detailed: one of them is missing or not a list"]
    out = []
    prompts = data.get("num_prompts")
    if len(lens) != prompts or len(errors) != prompts:
        out.append(f"{len(lens)} output_lens and {len(errors)} errors for {prompts} prompts: one each")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lens):
        return [*out, "output_lens holds something that is not a count"]
    if not all(isinstance(e, str) for e in errors):
        return [*out, "errors holds something that is not text"]
    served = sum(not e for e in errors)
    if served != completed:
        out.append(f"{served} requests without an error in errors, {completed} completed: they are the same requests")
    total = data.get("total_output_tokens")
    if isinstance(total, int) and sum(lens) != total:
        out.append(f"output_lens add up to {sum(lens)}, total_output_tokens is {total}: vLLM sums exactly these")
    if any(n for n, e in zip(lens, errors, strict=False) if e):
        out.append("a failed request has output tokens in output_lens: vLLM counts a failed request's as 0")
    return out


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def check(data: dict[str, Any], completed: int, what: str) -> None:
    """UnreadableEvidence naming every rule the result breaks."""
    broken = violations(data, completed)
    if broken:
        raise UnreadableEvidence(f"{what} is not possible evidence: " + "; ".join(broken))
