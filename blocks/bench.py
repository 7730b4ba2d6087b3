"""`vllm bench serve` parameters; defaults are the seed's section 8."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator, model_validator

from k3deploy.blocks._types import Arg, StrictBlock, Text

Workload = Literal["random", "prefix_repetition"]


class Baseline(BaseModel):
    """A figure a run must reach: throughput ≥ threshold × value, latency (`…_ms`) ≤ threshold × value."""

    model_config = ConfigDict(extra="forbid")

    metric: Text = Field(description="A key of vllm bench's saved JSON, e.g. output_throughput or p99_ttft_ms.")
    value: float = Field(gt=0, description="The baseline's figure.")
    threshold: float = Field(
        default=0.9, gt=0, description="Factor on the baseline: ≥ for throughput (0.9), ≤ for latency (say 1.2)."
    )
    workload: Workload = Field(default="random", description="random (cold prefix) or prefix_repetition (hits).")
    concurrency: int | None = Field(default=None, ge=1, description="Only the run at this concurrency (default all).")


class Slo(BaseModel):
    """Service-level objectives in ms; vLLM counts a request toward `request_goodput` when it meets all set."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(default=None, gt=0, description="Time to first token, at most.")
    tpot_ms: float | None = Field(default=None, gt=0, description="Time per output token, at most.")
    e2el_ms: float | None = Field(default=None, gt=0, description="End-to-end latency, at most.")

    def goodput_args(self) -> list[str]:
        """vllm bench serve's `--goodput ttft:500 tpot:50` (KEY:VALUE, ms), or nothing when none is set."""
        pairs = [f"{key}:{value:g}" for key, value in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms),
                                                        ("e2el", self.e2el_ms)) if value is not None]  # fmt: skip
        return ["--goodput", *pairs] if pairs else []


class Validity(BaseModel):
    """When a bench cell measures what it claims to; an invalid cell never passes the stage or enters history."""

    model_config = ConfigDict(extra="forbid")

    cold_max_hit_rate: float = Field(
        default=0.1, ge=0, le=1, description="The cold workload (random) is invalid above this prefix-cache hit rate."
    )
    prefix_min_hit_rate: float = Field(
        default=0.25, ge=0, le=1, description="The prefix-hit workload is invalid below this prefix-cache hit rate."
    )
    min_concurrency_ratio: float = Field(
        default=0.5, gt=0, le=1,
        description="Achieved concurrency (sum of request latencies / duration) below this × the requested one "
        "(capped at num_prompts) is client or server saturation: invalid.",
    )  # fmt: skip
    acceptance_tolerance: float = Field(
        default=0.1, ge=0, lt=1,
        description="With bench.speculative_reference: a mean acceptance length below the reference by more than "
        "this fraction makes the speculative cell invalid.",
    )  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _older_tail_key(cls, data: object) -> object:
        """Records and configs from before tail_confidence gave `tail_min_requests` n (a p99 from fewer was
        flagged): the same rule for p99 is confidence 1 − 0.99^n, so a bisect against an older run reads it."""
        if isinstance(data, dict) and "tail_min_requests" in data:
            data = dict(data)
            n = data.pop("tail_min_requests")
            if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
                data.setdefault("tail_confidence", 1 - 0.99**n)
            else:
                raise ValueError(f"tail_min_requests is {n!r}, not a count of requests ≥ 1")
        return data

    tail_confidence: float = Field(
        default=0.95, gt=0, lt=1,
        description="A percentile p is a figure only from n ≥ ln(1 − this) / ln(p) completed requests (p99: 299, "
        "p90: 29 at 0.95): from fewer, n draws all fall below the true p-th percentile with more than 1 − this "
        "chance, and the figure is their maximum. Flagged; judged by a baseline, the cell is invalid.",
    )  # fmt: skip


class BenchConfig(StrictBlock):
    """Load test run against node 0 once the service is ready."""

    _block_type_name = "k3deploy bench"

    backend: Text = Field(default="openai-chat", description="--backend")
    endpoint: Text = Field(default="/v1/chat/completions", description="--endpoint")
    dataset_name: Text = Field(default="random", description="--dataset-name")
    random_input_len: int = Field(default=1024, ge=1, description="--random-input-len")
    random_output_len: int = Field(default=128, ge=1, description="--random-output-len")
    random_range_ratio: float = Field(default=0.0, ge=0.0, le=1.0, description="--random-range-ratio")
    num_prompts: int = Field(default=100, ge=1, description="--num-prompts; every one must succeed.")
    max_concurrency: int = Field(default=4, ge=1, description="--max-concurrency")
    request_rate: float = Field(default=float("inf"), gt=0, description="--request-rate; inf sends at once.")
    ignore_eos: bool = Field(default=True, description="--ignore-eos keeps output lengths fixed.")
    percentile_metrics: Text = Field(default="ttft,tpot,itl,e2el", description="--percentile-metrics")
    metric_percentiles: Text = Field(default="50,90,99", description="--metric-percentiles")
    result_dir: Text = Field(default="./benchmark-results", description="--result-dir for --save-result, on node 0.")
    prefix_hit: bool = Field(
        default=True,
        description="Also run the prefix-hit workload (prefix_repetition), reported apart from the cold one.",
    )
    prefix_repetition_num_prefixes: int = Field(default=5, ge=1, description="--prefix-repetition-num-prefixes")
    concurrency_sweep: list[int] = Field(
        default_factory=list,
        description="Further --max-concurrency values to run; runs already saved in the run's folder are not repeated.",
    )
    timeout_s: float = Field(default=3600, gt=0, description="Each vllm bench run must end within this.")
    repeats: int = Field(
        default=1, ge=1, le=20, description="Runs of each cell; figures are their medians, with spread."
    )
    slo: Slo = Field(default_factory=Slo, description="SLOs for vLLM's --goodput; request_goodput is then judged.")
    validity: Validity = Field(
        default_factory=Validity, description="When a cell counts as VALID: the bench.validity.* keys."
    )
    reset_prefix_cache: bool = Field(
        default=False,
        description="POST /reset_prefix_cache before each cell, so none is served from an earlier cell's cache "
        "(vLLM serves it only with VLLM_SERVER_DEV_MODE=1 in serve.env).",
    )
    speculative_reference: dict[int, float] = Field(
        default_factory=dict,
        description="The mean acceptance length expected of the draft per num_speculative_tokens (e.g. the draft's "
        "published curve); a cell measured below it (bench.validity.acceptance_tolerance) is invalid. None for the "
        "served count: acceptance is recorded, not judged.",
    )
    baselines: list[Baseline] = Field(default_factory=list, description="Figures each run is compared with.")
    extra_args: list[Arg] = Field(default_factory=list, description="Further flags, appended as given.")

    @field_validator("speculative_reference")
    @classmethod
    def _possible_lengths(cls, value: dict[int, float]) -> dict[int, float]:
        # k draft tokens accept 0..k of them, plus the target's own token: a mean length from 1 to k + 1
        for k, length in value.items():
            if k < 1 or not 1 <= length <= k + 1:
                raise ValueError(f"{k}: {length}: a mean acceptance length for {k} speculative token(s) is from 1 "
                                 f"to {k + 1}")  # fmt: skip
        return value

    @field_serializer("request_rate")
    def _rate_as_json(self, value: float) -> float | str:
        # JSON (and Prefect's block store) has no infinity; "inf" parses back to float("inf").
        return "inf" if math.isinf(value) else value
