"""Accuracy evaluators against the served endpoint: lm_eval and AISBench, with local datasets only."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.blocks._types import AbsPath, StrictBlock, Text


class EvaluatorEnvironment(BaseModel):
    """A Python environment k3deploy makes for one evaluator, on the machine that runs k3deploy."""

    model_config = ConfigDict(extra="forbid")

    path: AbsPath = Field(description="Where the environment lives (made once, reused while its spec is the same).")
    python: AbsPath = Field(default="/usr/bin/python3", description="Interpreter the environment is made from.")
    packages: list[Text] = Field(description="pip requirements, pinned.")
    timeout_s: float = Field(default=1800, gt=0, description="Longest the install may take.")


class Scoring(BaseModel):
    """What the evaluator's score is compared with: |score − baseline| ≤ threshold (vllm-ascend's rule)."""

    model_config = ConfigDict(extra="forbid")

    baseline: float | None = Field(default=None, description="The expected score; None: recorded, not compared.")
    threshold: float = Field(default=0.02, ge=0, description="Largest distance from the baseline that passes.")


class LmEvalSettings(Scoring):
    environment: EvaluatorEnvironment = Field(
        default_factory=lambda: EvaluatorEnvironment(
            path="/var/tmp/k3deploy/envs/lm-eval-0.4.13", packages=["lm-eval[api]==0.4.13"]
        ),
        description="lm_eval's environment (lm-eval with its API extra).",
    )
    tasks: list[Text] = Field(default_factory=list, description="Task names, from include_path or lm_eval's own.")
    include_path: Text | None = Field(
        default=None,
        description="Folder of task YAMLs and their data files; lm_eval runs in it (no downloads). "
        "A relative path is taken from the folder k3deploy runs in.",
    )
    metric: Text | None = Field(
        default=None, description="Result key scored, e.g. 'exact_match,first-number'; default: the task's first."
    )
    num_concurrent: int = Field(default=4, ge=1, description="Requests in flight.")
    max_retries: int = Field(default=3, ge=1, description="Attempts per request before lm_eval gives up.")
    request_timeout_s: float = Field(default=600, gt=0, description="Each request must answer within this.")
    limit: int | None = Field(default=None, ge=1, description="At most this many samples per task.")
    timeout_s: float = Field(default=4 * 3600, gt=0, description="The whole evaluation must end within this.")


class AisBenchSettings(Scoring):
    environment: EvaluatorEnvironment = Field(
        default_factory=lambda: EvaluatorEnvironment(
            path="/var/tmp/k3deploy/envs/ais-bench-3.1.20260630",
            packages=["torch==2.13.0", "pyarrow<20", "ais-bench-benchmark==3.1.20260630"],
        ),
        description="AISBench's environment (it pins numpy<2, hence an older pyarrow; torch for accelerate).",
    )
    dataset_path: Text | None = Field(
        default=None,
        description="A custom dataset file (.jsonl with question and answer), read locally. "
        "A relative path is taken from the folder k3deploy runs in.",
    )
    max_out_len: int = Field(default=512, ge=1, description="max_out_len of the vLLM chat model config.")
    batch_size: int = Field(default=4, ge=1, description="Requests in flight.")
    timeout_s: float = Field(default=4 * 3600, gt=0, description="The whole evaluation must end within this.")


class AccuracyConfig(StrictBlock):
    """Accuracy against the running service; not applicable until an evaluator is chosen."""

    _block_type_name = "k3deploy accuracy"

    evaluators: list[Literal["lm_eval", "ais_bench"]] = Field(
        default_factory=list, description="Evaluators to run, in order (each needs its dataset configured)."
    )
    lm_eval: LmEvalSettings = Field(default_factory=LmEvalSettings, description="lm_eval settings.")
    ais_bench: AisBenchSettings = Field(default_factory=AisBenchSettings, description="AISBench settings.")
