"""Configuration and credentials as Prefect Blocks; one YAML document fills all of them."""

from k3deploy.blocks.bench import BenchConfig
from k3deploy.blocks.cluster import ClusterConfig, NodeSpec, SSHSettings
from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.image import ImageBuild, ImageConfig, RegistryAuth
from k3deploy.blocks.loader import load_config, parse_config
from k3deploy.blocks.models import CheckpointSpec, DraftSpec, ModelsConfig
from k3deploy.blocks.serve import ContainerSettings, ServeConfig

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
