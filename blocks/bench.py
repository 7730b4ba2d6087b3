"""`vllm bench serve` parameters; defaults are the seed's section 8."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

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
    baselines: list[Baseline] = Field(default_factory=list, description="Figures each run is compared with.")
    extra_args: list[Arg] = Field(default_factory=list, description="Further flags, appended as given.")

    @field_serializer("request_rate")
    def _rate_as_json(self, value: float) -> float | str:
        # JSON (and Prefect's block store) has no infinity; "inf" parses back to float("inf").
        return "inf" if math.isinf(value) else value
