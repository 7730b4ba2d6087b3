"""The comm stage: vLLM-Ascend's multi-node communication checks on every node and NPU, plus host checks."""

from __future__ import annotations

from typing import Any

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.comm.steps import comm_checks
from prefect import flow

DEFAULT_CONFIG = "configs/local.yaml"


@flow(name="comm")
def comm(config: str = DEFAULT_CONFIG, fresh: bool = False) -> dict[str, Any]:
    """Every NPU healthy and reachable across nodes, TLS and driver consistent; else fail naming node and NPU.

    A pass is reused for an hour for the same nodes (a rerun of a later stage); `fresh` runs it anyway.
    """
    cfg = load_config(config)
    report = comm_checks.with_options(refresh_cache=fresh)(cfg)
    return {"verdict": "pass", "summary": report.summary(), "phase_seconds": dict(report.phase_seconds)}
