"""`vllm bench serve` parameters; defaults are the seed's section 8."""

from __future__ import annotations

import math

from pydantic import Field, field_serializer

from k3deploy.blocks._types import Arg, StrictBlock, Text


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
    result_dir: Text = Field(default="./benchmark-results", description="--result-dir for --save-result.")
    extra_args: list[Arg] = Field(default_factory=list, description="Further flags, appended as given.")

    @field_serializer("request_rate")
    def _rate_as_json(self, value: float) -> float | str:
        # JSON (and Prefect's block store) has no infinity; "inf" parses back to float("inf").
        return "inf" if math.isinf(value) else value
