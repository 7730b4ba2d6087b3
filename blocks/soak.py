"""Soak settings: steady load for minutes to hours, in windows, and when time-borne drift fails it."""

from __future__ import annotations

from pydantic import Field

from k3deploy.blocks._types import StrictBlock


class SoakDrift(StrictBlock):
    """What the last windows may lose against the first ones, and how fast memory may grow."""

    windows: int = Field(default=2, ge=1, description="The first N windows against the last N.")
    latency: float = Field(
        default=0.25, gt=0,
        description="The last windows' median TTFT or TPOT (the median of their p50s) above the first windows' by "
        "more than this fraction is latency drift.",
    )  # fmt: skip
    throughput: float = Field(
        default=0.2, gt=0, lt=1,
        description="The last windows' output throughput below the first windows' by more than this fraction is drift.",
    )  # fmt: skip
    memory_horizon_hours: float = Field(
        default=24, gt=0,
        description="A rank's memory growing at a slope (least squares over the windows after the first) that would "
        "take all of the memory still free on its node (or the NPU's HBM) within this many hours is a leak.",
    )  # fmt: skip
    memory_noise_mb: float = Field(
        default=256, ge=0,
        description="Growth of a rank's memory over the soak below this many MiB is noise (an allocator warming up), "
        "whatever its slope.",
    )  # fmt: skip
    fails: bool = Field(default=True, description="Drift fails the stage; false: flagged in the findings, a pass.")


class SoakConfig(StrictBlock):
    """Steady load in windows, each a real `vllm bench serve` run, judged as it ends and for drift at the end."""

    _block_type_name = "k3deploy soak"

    enabled: bool = Field(
        default=False, description="Run the soak in every run (off: only when a run asks, --soak; weekly: the "
        "`soak` deployment).",
    )  # fmt: skip
    minutes: float = Field(
        default=240, gt=0, description="How long the load goes on: windows run until this is spent (and at least "
        "the windows drift needs: 2 × drift.windows, and 3 for a memory slope).",
    )  # fmt: skip
    concurrency: int | None = Field(
        default=None, ge=1, description="Requests in flight (--max-concurrency); default the bench's max_concurrency."
    )
    window_prompts: int = Field(
        default=400, ge=1, description="Prompts of each window (--num-prompts): a window lasts as long as they take."
    )
    drift: SoakDrift = Field(default_factory=SoakDrift, description="When time-borne drift fails the soak.")

    def in_flight(self, bench_concurrency: int) -> int:
        return self.concurrency or bench_concurrency
