"""The launch stage: start node 0 then the headless ranks as the plan shows them, wait until really ready.

Whatever happens after the first container starts, this run's containers are removed on failure,
crash and cancellation (flow hooks); on success only when asked, since later stages use the service.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.launch.steps import (
    remove_containers,
    remove_run_containers,
    start_containers,
    wait_until_ready,
)
from k3deploy.tasks.render import Plan, render_plan
from prefect import flow, runtime, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_logger

DEFAULT_CONFIG = "configs/local.yaml"


def teardown_hook(flow: Any, flow_run: Any, state: Any) -> None:
    """On failure, crash or cancellation: remove what this run started, on every node."""
    logger = get_logger("k3deploy.launch")
    try:
        removed = remove_run_containers(load_config(flow_run.parameters["config"]), str(flow_run.id))
        logger.info("launch ended %s; removed %s", state.name, removed)
    except Exception:
        logger.exception("teardown after %s failed: containers of run %s may be left", state.name, flow_run.id)
        raise


@task(name="publish launch artifacts", cache_policy=NO_CACHE)
def publish_plan(plan: Plan) -> None:
    create_markdown_artifact(f"```sh\n{plan.to_text()}\n```\n", key="launch-commands", description="what launch runs")


@flow(name="launch", on_failure=[teardown_hook], on_crashed=[teardown_hook], on_cancellation=[teardown_hook])
def launch(config: str = DEFAULT_CONFIG, teardown_after: bool = False) -> dict[str, Any]:
    """Serving on every node, ready for real requests on every DP rank, or failed naming node, rank and line."""
    cfg = load_config(config)
    run_id = str(runtime.flow_run.id)
    plan = render_plan(cfg, run_id=run_id)  # the same renderer as `k3deploy plan`
    publish_plan(plan)
    started = start_containers(cfg, plan)
    record = wait_until_ready(cfg, plan, started, run_id)
    if teardown_after:
        remove_containers(cfg, run_id)
    return asdict(record)
