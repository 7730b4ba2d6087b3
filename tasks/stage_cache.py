"""A cached stage: its result persists once it passed, keyed by the run, the stage and what it reads.

On the UI's Retry of a failed validate run (the same flow run), or `k3deploy rerun RUN_ID`, the task
is a cache hit and the stage does not run again unless those inputs changed; a failure raises and
is never cached.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Protocol

from prefect import task
from prefect.context import TaskRunContext

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.stage import StageResult


class CachedStage(Protocol):
    """What the key needs of a registry entry."""

    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> tuple[str, ...]: ...
    @property
    def options(self) -> tuple[str, ...]: ...


def stage_inputs_key(stage: CachedStage, cfg: DeploymentConfig, options: dict[str, Any], run_id: str) -> str:
    """This run, this stage and what it reads: a retry of the run skips the stage only if these are the same."""
    public = cfg.public()
    inputs = {section: public.get(section) for section in stage.inputs}
    inputs["options"] = {k: v for k, v in options.items() if k in stage.options}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"k3deploy-stage-{run_id}-{stage.name}-{digest}"


def _key(_context: TaskRunContext, parameters: dict[str, Any]) -> str:
    return str(parameters["key"])


@task(name="passed stage", task_run_name="{name}", cache_key_fn=_key, persist_result=True)
def passed_stage(
    name: str, stage_flow: Callable[..., StageResult], cfg: DeploymentConfig, options: dict[str, Any], key: str
) -> StageResult:
    """The stage's flow as a subflow inside a task whose result persists only when it passed."""
    return stage_flow(config=cfg, **options)
