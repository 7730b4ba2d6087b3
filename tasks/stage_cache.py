"""A cached stage: its result persists once it passed, keyed by the run, the stage and what it reads.

On the UI's Retry of a failed validate run (the same flow run), or `k3deploy rerun RUN_ID`, the task
is a cache hit and the stage does not run again unless those inputs changed; a failure raises and
is never cached. With a shared store on the server, results are kept there, so a Retry picked up by
another worker finds them too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Protocol

from prefect import Task, task
from prefect.context import TaskRunContext

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.stage import StageResult
from k3deploy.tasks.transport.sftp_store import shared_store, unreachable


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
    return f"k3deploy-stage-{run_id}-{stage.name}-{inputs_digest(stage, cfg.public(), options)}"


def inputs_digest(stage: CachedStage, public: dict[str, Any], options: dict[str, Any]) -> str:
    """What the stage reads of a config (as `DeploymentConfig.public()` or a run record holds it) and its options."""
    inputs: dict[str, Any] = {path: _pick(public, path) for path in stage.inputs}
    inputs["options"] = {k: v for k, v in options.items() if k in stage.options}
    return hashlib.sha256(json.dumps(_numbers(inputs), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _numbers(value: Any) -> Any:
    """60.0 as 60: a record read back from JSON holds whole floats as ints, and is the same config."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def _pick(data: dict[str, Any], dotted: str) -> Any:
    value: Any = data
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _key(_context: TaskRunContext, parameters: dict[str, Any]) -> str:
    return str(parameters["key"])


@task(name="passed stage", task_run_name="{name}", cache_key_fn=_key, persist_result=True)
def passed_stage(
    name: str, stage_flow: Callable[..., StageResult], cfg: DeploymentConfig, options: dict[str, Any], key: str
) -> StageResult:
    """The stage's flow as a subflow inside a task whose result persists only when it passed."""
    return stage_flow(config=cfg, **options)


PassedStage = Task[[str, Callable[..., StageResult], DeploymentConfig, dict[str, Any], str], StageResult]


def stage_task() -> PassedStage:
    """passed_stage, its results in the server's shared store when it has one (and it answered at the run's start),
    else in this host's storage."""
    store = shared_store()
    if store is None or unreachable(store):
        return passed_stage
    return passed_stage.with_options(result_storage=store)
