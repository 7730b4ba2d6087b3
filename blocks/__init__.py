"""Configuration and credentials as Prefect Blocks; one YAML document fills all of them.

Names are imported on first use (PEP 562), so that reading a YAML file and reporting its syntax
errors does not wait for Prefect to import.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "AccuracyConfig": "accuracy",
    "AlertsConfig": "alerts",
    "BenchConfig": "bench",
    "CheckpointSpec": "models",
    "ClusterConfig": "cluster",
    "ConformanceConfig": "conformance",
    "ConformanceThresholds": "conformance",
    "ContainerSettings": "serve",
    "DeploymentConfig": "deployment",
    "DraftSpec": "models",
    "ImageBuild": "image",
    "ImageConfig": "image",
    "ModelsConfig": "models",
    "NodeSpec": "cluster",
    "RegistryAuth": "image",
    "SSHSettings": "cluster",
    "ServeConfig": "serve",
    "SmokeConfig": "smoke",
    "load_config": "loader",
    "parse_config": "loader",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
