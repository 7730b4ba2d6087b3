"""The Prefect task of the comm stage: a thin wrapper over run_comm_checks, cached while it passes."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger
from prefect.variables import Variable

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import K3DeployError, TransportError
from k3deploy.tasks.comm.report import CommReport
from k3deploy.tasks.comm.runner import run_comm_checks
from k3deploy.tasks.transport.base import run_all
from k3deploy.tasks.transport.factory import open_transports


class CommChecksFailed(K3DeployError):
    """Raised by the task so that a failed run is never cached; the flow turns it into CommStageFailed."""

    def __init__(self, report: CommReport) -> None:
        super().__init__(report.summary())
        self.report = report


def _cluster_hash(cfg: DeploymentConfig) -> str:
    facts = {
        "nodes": [n.model_dump(mode="json") for n in cfg.cluster.nodes],
        "npus": cfg.cluster.npus_per_node,
        "ports": [cfg.serve.service_port, cfg.serve.rpc_port],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def _epoch_variable(cfg: DeploymentConfig) -> str:
    """A Prefect Variable counting this cluster's failed comm runs: a failure retires any earlier pass."""
    return f"k3deploy_comm_failures_{_cluster_hash(cfg)}"


def _comm_key(context: Any, parameters: dict[str, Any]) -> str:
    """The same nodes, addresses, NICs, NPU count and ports, and no failure since: a pass still holds."""
    cfg: DeploymentConfig = parameters["cfg"]  # v2: the report's rows are the stage's findings (older won't load)
    return f"comm-v2-{_cluster_hash(cfg)}-{Variable.get(_epoch_variable(cfg), default=0)}"


@task(name="reach every node", cache_policy=NO_CACHE)
def reach_every_node(cfg: DeploymentConfig) -> None:
    """Never cached: a reused pass still connects to every node and checks its pinned host key first."""
    with open_transports(cfg.cluster) as transports:
        results = run_all(transports, "true", timeout=60, idempotent=True, purpose="checking the node answers")
    bad = {node: str(r) for node, r in results.items() if isinstance(r, TransportError)}
    if bad:
        raise K3DeployError("cannot reach or trust " + "; ".join(f"{n} ({why})" for n, why in bad.items()))


# A pass is reused for an hour; a failed run is never cached, and it retires the passes before it.
@task(name="comm checks", cache_key_fn=_comm_key, cache_expiration=timedelta(hours=1), persist_result=True)
def comm_checks(cfg: DeploymentConfig, timeout_s: float = 300) -> CommReport:
    """Run every check on every node and NPU; raise (so it is never cached) on a failure."""
    with open_transports(cfg.cluster) as transports:
        report = run_comm_checks(transports, cfg.cluster, cfg.serve, timeout_s)
    get_run_logger().info("%s (phases: %s s)", report.summary(), report.phase_seconds)
    if not report.ok:
        name = _epoch_variable(cfg)
        Variable.set(name, int(Variable.get(name, default=0) or 0) + 1, overwrite=True)
        raise CommChecksFailed(report)
    return report
