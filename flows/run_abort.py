"""The one abort hook: a run cancelled (from the UI, `prefect flow-run cancel`) or crashed leaves nothing serving.

`validate` and `launch` (when run alone) both end with it. It runs where the run was killed: in the
run's own process it finds the config the run resolved (`serving`); in a runner's or worker's process,
which knows only the parameters, it resolves the config again from its path or block name, with the
run's draft choice (it changes what was served). A run whose worker itself died runs no hook:
`k3deploy teardown -c …` clears it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.logging import get_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.source import resolve_config
from k3deploy.core.errors import K3DeployError
from k3deploy.flows.run_options import AS_CONFIGURED, BenchOptions, apply_options
from k3deploy.tasks.teardown import remove_servers

# The config each run in this process resolved, by flow run id: what its hook tears down.
_SERVING: dict[str, DeploymentConfig] = {}


@contextmanager
def serving(run_id: str, cfg: DeploymentConfig) -> Iterator[None]:
    """While inside, a crash or cancellation of run `run_id` in this process tears down `cfg`'s servers.

    Left in place when the body raises: the flow's hooks run after it has unwound, and find it then.
    """
    _SERVING[run_id] = cfg
    yield
    _SERVING.pop(run_id, None)


def teardown_on_abort(flow: Any, flow_run: Any, state: Any) -> None:
    """Remove every server of the run's config on every node (the flow's on_cancellation and on_crashed)."""
    logger = get_logger(f"k3deploy.{flow.name}")
    cfg = _SERVING.pop(str(flow_run.id), None)
    if cfg is None and flow.name == "validate" and not _stage_runs_of(flow_run.id):
        # It never got the cluster (queued behind another run): the service there is not its own.
        logger.info("%s %s ended %s before any stage: nothing to tear down", flow.name, flow_run.id, state.name)
        return
    params = flow_run.parameters
    if cfg is None and not isinstance(params.get("config"), str):
        logger.error("%s %s ended %s; its config is unknown here: run `k3deploy teardown`", flow.name, flow_run.id,
                     state.name)  # fmt: skip
        return
    try:
        if cfg is None:
            draft = str(params.get("draft") or AS_CONFIGURED)
            cfg = apply_options(resolve_config(params["config"]), draft, BenchOptions())
        removed = remove_servers(cfg)
    except (K3DeployError, KeyError) as err:
        logger.error("%s %s ended %s; teardown failed (%s): run `k3deploy teardown`", flow.name, flow_run.id,
                     state.name, err)  # fmt: skip
        raise
    if any(removed.values()):
        logger.info("%s %s ended %s; removed %s", flow.name, flow_run.id, state.name, removed)
    else:
        logger.warning("%s %s ended %s; no server of its config (fingerprint %s) found: if its config changed "
                       "since, run `k3deploy teardown` with the one it ran", flow.name, flow_run.id, state.name,
                       cfg.fingerprint())  # fmt: skip


def _stage_runs_of(run_id: Any) -> list[Any]:
    """The stage subflow runs a validate run started: only a run holding the cluster starts any."""
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])), limit=1
        )
