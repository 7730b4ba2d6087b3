"""The stage registry: every stage once, in pipeline order, and the options they take as one model.

The CLI (its stage names and flags), `validate` (its stages and its form) and the deployments read it.
Imports nothing heavy (pydantic, no Prefect), so the CLI can name and check stages before Prefect starts.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StageOptions(BaseModel):
    """What a person may choose for the stages of one run: one group in validate's form (so the UI's), the
    CLI's flags take their help from it, and each stage flow takes the fields its registry entry names."""

    model_config = ConfigDict(extra="forbid")

    download: bool = Field(default=True, description="models: download missing or bad checkpoint files (else fail).")
    full_verify: bool = Field(
        default=False, description="models: hash every checkpoint file on every node, whatever manifests say."
    )
    fresh: bool = Field(default=False, description="comm: run the checks again even when a pass is recent.")
    capacity: bool = Field(
        default=False, description="capacity: search for the highest concurrency at the SLOs, even when the config's "
        "capacity.enabled is false.",
    )  # fmt: skip
    soak: bool = Field(
        default=False, description="soak: steady load for soak.minutes, even when the config's soak.enabled is false."
    )
    soak_restart: bool = Field(
        default=False, description="soak: on a Retry, start the windows over instead of taking over those judged."
    )

    def of(self, stage: Stage) -> dict[str, Any]:
        """The options `stage`'s flow takes, as its keyword arguments."""
        return {name: getattr(self, name) for name in stage.options}


@dataclass(frozen=True)
class Stage:
    name: str
    flow: str  # "module:attribute" of the Prefect flow, imported when first run
    summary: str
    cached: bool = False  # persisted result: a retry of validate does not run it again once it passed
    options: tuple[str, ...] = ()  # the StageOptions fields the flow takes (parameters of the same name)
    alone: tuple[str, ...] = ()  # parameters only a run of the stage by itself sets (`k3deploy rerun -c`)
    inputs: tuple[str, ...] = ()  # config sections or keys a cached stage reads: a retry runs it again if they changed

    def __post_init__(self) -> None:
        unknown = set(self.options) - set(StageOptions.model_fields)
        if unknown:
            raise ValueError(f"stage {self.name}: options {sorted(unknown)} are not StageOptions fields")

    def load(self) -> Any:
        module, attribute = self.flow.split(":")
        return getattr(importlib.import_module(module), attribute)


STAGES: tuple[Stage, ...] = (
    # Never cached: every run connects to every node and checks its host key first.
    Stage("preflight", "k3deploy.flows.preflight:preflight", "SSH with pinned host keys, node facts"),
    Stage("models", "k3deploy.flows.models:models", "checkpoints verified on every node",
          cached=True, options=("download", "full_verify"),
          inputs=("cluster", "models", "serve.quantization", "serve.max_model_len",
                  "serve.env.VLLM_ALLOW_LONG_MAX_MODEL_LEN")),
    Stage("comm", "k3deploy.flows.comm:comm", "NPU links and cross-node pings",
          cached=True, options=("fresh",), inputs=("cluster", "serve.service_port", "serve.rpc_port")),
    Stage("image", "k3deploy.flows.image:image", "one image everywhere, the tokenizer mode and parsers inside",
          cached=True, inputs=("cluster", "image", "serve.runtime", "serve.container", "serve.tokenizer_mode",
                               "serve.tool_call_parser", "serve.reasoning_parser")),
    # Never cached: what it starts is torn down at the end of every run.
    Stage("launch", "k3deploy.flows.launch:launch", "serving and ready on every DP rank", alone=("teardown_after",)),
    # Never cached: they ask the service that this run started (or one left up with --keep-serving).
    Stage("smoke", "k3deploy.flows.smoke:smoke", "real requests: chat, stream, tools, reasoning, cache, every rank"),
    # Cached by what shapes the served API's answers (the engine, the checkpoint, the flags, the suite): a retry of a
    # run that passed it does not send the suite again to a service started from the same inputs.
    Stage("conformance", "k3deploy.flows.conformance:conformance",
          "the Kimi-K3 API contract: tool calls vs their schemas, streamed and under load, usage, parameters",
          cached=True, inputs=("cluster", "models", "image", "serve", "conformance")),
    Stage("bench", "k3deploy.flows.bench:bench", "vllm bench serve: every request served, figures vs baselines"),
    Stage("capacity", "k3deploy.flows.capacity:capacity",
          "the highest concurrency holding the SLOs: probes by doubling, then bisection", options=("capacity",)),
    Stage("soak", "k3deploy.flows.soak:soak", "steady load for hours in windows: failures at once, drift at the end",
          options=("soak", "soak_restart")),
    Stage("accuracy", "k3deploy.flows.accuracy:accuracy", "lm_eval and AISBench scores, samples accounted for"),
    Stage("teardown", "k3deploy.flows.teardown:teardown", "nothing of the run left running", alone=("run_id",)),
)  # fmt: skip
# `validate` always ends with teardown (unless keep_serving) and then writes the run record.
FINAL = "teardown"

BY_NAME = {stage.name: stage for stage in STAGES}


def stage(name: str) -> Stage:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(BY_NAME)}") from None


def select(only: list[str] | None = None, start: str | None = None) -> list[Stage]:
    """The stages a validate run executes before the final teardown, in pipeline order.

    `only` runs just those (preflight is always added: no stage runs without checking host keys);
    `start` runs from that stage on (preflight first all the same).
    """
    if only and start:
        raise ValueError("give either only or from, not both")
    body = [s for s in STAGES if s.name != FINAL]
    names = [s.name for s in body]
    for name in [*(only or []), *([start] if start else [])]:
        if name not in BY_NAME:
            raise ValueError(f"unknown stage {name!r}; stages: {', '.join(BY_NAME)}")
    if only:
        chosen = [s for s in body if s.name in only or s.name == "preflight"]
    elif start:
        chosen = [s for s in body if s.name == "preflight" or names.index(s.name) >= names.index(start)]
    else:
        chosen = body
    return chosen
