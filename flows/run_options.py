"""What a person may choose per run, from the Prefect UI's form or the CLI, over the saved config.

Enums become dropdowns and pydantic models groups in Prefect's parameter form; every field has a
description. Secrets are never options: Prefect stores parameters in plain text.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.models import KNOWN_DRAFTS

AS_CONFIGURED = "as configured"

DraftChoice = StrEnum(  # type: ignore[misc]
    "DraftChoice", {"as_configured": AS_CONFIGURED, "none": "none", **{r.replace("/", "_"): r for r in KNOWN_DRAFTS}}
)


class BenchWorkloads(StrEnum):
    as_configured = AS_CONFIGURED
    cold = "cold only (random)"
    cold_and_prefix_hit = "cold and prefix hit (random, prefix_repetition)"


class BenchOptions(BaseModel):
    """Bench choices for this run; anything left 'as configured' keeps the deployment's bench section."""

    model_config = ConfigDict(extra="forbid")

    workloads: BenchWorkloads = Field(
        default=BenchWorkloads.as_configured,
        description="The cold-prefix workload alone, or also the prefix-hit one (reported apart).",
    )
    concurrency_sweep: list[int] = Field(
        default_factory=list,
        description="Further --max-concurrency values to run after the configured one; empty: as configured.",
    )
    baseline_run: str = Field(
        default="",
        description="A run id (or prefix) whose bench and accuracy figures this run is also judged by; empty: none.",
    )


def apply_options(cfg: DeploymentConfig, draft: str, bench: BenchOptions) -> DeploymentConfig:
    """The config with this run's choices applied, checked again as a whole."""
    if draft == AS_CONFIGURED and bench.workloads == BenchWorkloads.as_configured and not bench.concurrency_sweep:
        return cfg
    data: dict[str, Any] = cfg.model_dump(mode="python", exclude_unset=False)
    if draft == "none":
        data["models"]["draft"] = None
    elif draft != AS_CONFIGURED:
        current = data["models"].get("draft") or {}
        if current.get("repo") != draft:
            data["models"]["draft"] = {"repo": draft, "revision": "main"}
    if bench.workloads != BenchWorkloads.as_configured:
        data["bench"]["prefix_hit"] = bench.workloads == BenchWorkloads.cold_and_prefix_hit
    if bench.concurrency_sweep:
        data["bench"]["concurrency_sweep"] = list(bench.concurrency_sweep)
    return DeploymentConfig.model_validate(data)
