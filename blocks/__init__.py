"""Configuration and credentials as Prefect Blocks; one YAML document fills all of them."""

from blocks.bench import BenchConfig
from blocks.cluster import ClusterConfig, NodeSpec, SSHSettings
from blocks.deployment import DeploymentConfig
from blocks.image import ImageBuild, ImageConfig, RegistryAuth
from blocks.loader import load_config, parse_config
from blocks.models import CheckpointSpec, DraftSpec, ModelsConfig
from blocks.serve import ContainerSettings, ServeConfig

__all__ = [
    "BenchConfig",
    "CheckpointSpec",
    "ClusterConfig",
    "ContainerSettings",
    "DeploymentConfig",
    "DraftSpec",
    "ImageBuild",
    "ImageConfig",
    "ModelsConfig",
    "NodeSpec",
    "RegistryAuth",
    "SSHSettings",
    "ServeConfig",
    "load_config",
    "parse_config",
]
