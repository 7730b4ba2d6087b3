"""Capacity search settings: the SLOs the deployment must hold, how the search goes and where it stops."""

from __future__ import annotations

from pydantic import Field, model_validator

from k3deploy.blocks._types import StrictBlock


class CapacitySlo(StrictBlock):
    """What every request load must keep to count as held: a latency percentile and a goodput floor."""

    percentile: float = Field(
        default=99, gt=0, lt=100,
        description="The percentile the latency SLOs are judged at (the probes report it whatever "
        "bench.metric_percentiles says).",
    )  # fmt: skip
    ttft_ms: float | None = Field(
        default=2000, gt=0, description="Time to first token at that percentile, at most (null: not an SLO)."
    )
    tpot_ms: float | None = Field(
        default=100, gt=0, description="Time per output token at that percentile, at most (null: not an SLO)."
    )
    goodput: float = Field(
        default=0.95, ge=0, le=1,
        description="Requests that met every SLO set (vLLM's --goodput, per request), of all requests: at least.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _something_to_hold(self) -> CapacitySlo:
        if self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError("capacity.slo needs ttft_ms, tpot_ms or both: a capacity at no latency SLO is not one")
        return self

    def describe(self) -> str:
        """'p99 TTFT ≤ 2000 ms, p99 TPOT ≤ 50 ms, goodput ≥ 95 %'."""
        p = f"p{self.percentile:g}"
        parts = [f"{p} TTFT ≤ {self.ttft_ms:g} ms"] if self.ttft_ms is not None else []
        parts += [f"{p} TPOT ≤ {self.tpot_ms:g} ms"] if self.tpot_ms is not None else []
        return ", ".join([*parts, f"goodput ≥ {self.goodput:.0%}"])


class CapacityConfig(StrictBlock):
    """The highest concurrency at which every SLO holds, found by search (doubling, then bisection)."""

    _block_type_name = "k3deploy capacity"

    enabled: bool = Field(
        default=False, description="Run the capacity search in every run (off: only when a run asks, --capacity)."
    )
    slo: CapacitySlo = Field(default_factory=CapacitySlo, description="The SLOs every probe must hold.")
    start: int = Field(default=1, ge=1, description="The first concurrency probed; doubled while every SLO holds.")
    max_concurrency: int = Field(default=256, ge=1, description="No probe above this: the search's ceiling.")
    resolution: int = Field(
        default=1, ge=1, description="Bisection ends when the concurrency that holds and the one that does not are "
        "this close.",
    )  # fmt: skip
    max_probes: int = Field(default=12, ge=1, description="At most this many probes (bench runs) in one search.")
    max_minutes: float = Field(
        default=120, gt=0, description="No probe starts once the search has run this long (cluster time)."
    )
    prompts_per_concurrency: int = Field(
        default=8, ge=1,
        description="A probe at concurrency c sends c × this many prompts (and at least enough for the SLO's "
        "percentile at bench.validity.tail_confidence): most of it at full concurrency.",
    )  # fmt: skip
    ttft_growth: float = Field(
        default=1.5, gt=0,
        description="Over-saturation: the median TTFT growing by more than this × the concurrency's growth from the "
        "probe below (queueing: requests wait for a slot) stops the search; so does a probe that cannot reach the "
        "concurrency asked (bench.validity.min_concurrency_ratio).",
    )  # fmt: skip
    queue_share: float = Field(
        default=0.25, gt=0,
        description="Over-saturation read from the engine's own counters: requests that waited in its queue "
        "(vllm:request_queue_time_seconds, around the probe) longer on average than this share of their median "
        "TTFT wait for a slot; the search stops there.",
    )  # fmt: skip
    min_concurrency: int | None = Field(
        default=None, ge=1, description="The stage fails when the capacity found is below this (default: judged by "
        "history and the baseline run only).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _a_range(self) -> CapacityConfig:
        if self.start > self.max_concurrency:
            raise ValueError(f"start {self.start} is above max_concurrency {self.max_concurrency}")
        return self
