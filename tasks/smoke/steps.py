"""The smoke stage's units of work: what the checks need to know, and the checks run against node 0."""

from __future__ import annotations

import json
import shlex
import threading
import uuid

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import NodeError, TransportError
from k3deploy.tasks.endpoints import engines, service_url
from k3deploy.tasks.smoke.checks import CHECKS, Context
from k3deploy.tasks.smoke.driver import Row, run_checks
from k3deploy.tasks.transport.factory import open_transports


def declares_vision(config_json: str) -> bool:
    """A checkpoint takes images when its config.json has a vision_config (Kimi-K3's does)."""
    data = json.loads(config_json)
    return isinstance(data, dict) and bool(data.get("vision_config"))


@task(name="does the served model take images", cache_policy=NO_CACHE)
def served_vision(cfg: DeploymentConfig) -> bool:
    if cfg.smoke.vision != "auto":
        return cfg.smoke.vision == "yes"
    node = cfg.cluster.nodes[0].name
    path = f"{cfg.models.target.path}/config.json"
    with open_transports(cfg.cluster) as transports:
        try:
            text = transports[node].run(f"cat {shlex.quote(path)}", timeout=30).check().stdout
        except TransportError as err:
            raise NodeError(node, f"cannot read {path}: {err}") from None
    try:
        return declares_vision(text)
    except ValueError:
        raise NodeError(node, f"{path} is not JSON") from None


def context(cfg: DeploymentConfig, vision: bool) -> Context:
    ranks = engines(cfg)
    return Context(
        model=cfg.serve.served_model_name,
        vision=vision,
        prefix_caching=cfg.serve.enable_prefix_caching,
        engines=ranks,
        burst=cfg.smoke.burst_requests or 4 * len(ranks),
        max_tokens=cfg.smoke.max_tokens,
        reasoning_max_tokens=cfg.smoke.reasoning_max_tokens,
        nonce=uuid.uuid4().hex[:12],
    )


@task(name="smoke checks", cache_policy=NO_CACHE)  # asked of the live service, never cached
def smoke_checks(cfg: DeploymentConfig, ctx: Context, stop: threading.Event | None = None) -> list[Row]:
    """Every check against node 0; none started once `stop` is set (the service was lost)."""
    logger = get_run_logger()

    def show(row: Row) -> None:
        logger.info("%s: %s (%.1f s): %s", row.check, row.verdict, row.seconds, row.outcome.detail)

    return run_checks(service_url(cfg), CHECKS, ctx, cfg.smoke.request_timeout_s, show, stop)
