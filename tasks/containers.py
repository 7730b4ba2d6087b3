"""The serving containers on the nodes' engines: start what the plan shows, adopt or refuse, remove."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors

from k3deploy.core.errors import NodeError
from k3deploy.tasks.render import CONFIG_LABEL, RUN_LABEL, ContainerSpec


class ContainerError(NodeError):
    """A container could not be started, or one is in the way."""


def run_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """docker SDK arguments for exactly what `spec.docker_run_argv()` shows."""
    return {
        "image": spec.image,
        "command": spec.command,
        "name": spec.name,
        "environment": dict(spec.environment),
        "devices": list(spec.devices),
        "volumes": list(spec.volumes),
        "network_mode": spec.network,
        "shm_size": spec.shm_size,
        "labels": dict(spec.labels),
        "detach": True,
    }


@dataclass(frozen=True)
class Started:
    """A node's server as its runtime knows it: `handle` is a container id or a process's name."""

    node: str
    name: str
    handle: str
    adopted: bool


def _existing(client: docker.DockerClient, name: str) -> Any | None:
    try:
        return client.containers.get(name)
    except docker.errors.NotFound:
        return None


def start_or_adopt(client: docker.DockerClient, node: str, spec: ContainerSpec) -> Started:
    """Start the node's container; a running one of this very config is adopted, anything else refused.

    Never two servers on one node: a container with our name that is not ours stops the launch.
    """
    found = _existing(client, spec.name)
    if found is not None:
        labels = found.labels or {}
        ours = labels.get(CONFIG_LABEL) == spec.labels.get(CONFIG_LABEL)
        if ours and found.status == "running":
            return Started(node, spec.name, found.id, adopted=True)
        if not ours:
            owner = (
                f"config {labels[CONFIG_LABEL]}, run {labels.get(RUN_LABEL, '?')}"
                if CONFIG_LABEL in labels
                else "not started by k3deploy"
            )
            raise ContainerError(
                node,
                f"a container named {spec.name} is already there ({found.status}, {owner}); this config is "
                f"{spec.labels.get(CONFIG_LABEL)}. Run teardown for its config or remove it by hand.",
            )
        with contextlib.suppress(docker.errors.NotFound):
            found.remove(force=True)  # ours but dead: start it afresh
    try:
        container = client.containers.run(**run_kwargs(spec))
    except docker.errors.ImageNotFound:
        raise ContainerError(node, f"image {spec.image} is not on the node: run the image stage first") from None
    except docker.errors.APIError as err:
        raise ContainerError(node, f"cannot start {spec.name}: {err.explanation or err}") from None
    return Started(node, spec.name, container.id, adopted=False)


def labelled(client: docker.DockerClient, labels: Mapping[str, str]) -> list[Any]:
    """Every container (running or not) carrying all of these labels."""
    return client.containers.list(all=True, filters={"label": [f"{k}={v}" for k, v in labels.items()]})


def remove_labelled(
    client: docker.DockerClient, node: str, labels: Mapping[str, str], stop_timeout: int = 10
) -> list[str]:
    """Stop and remove them; returns the names removed. Already gone is fine: teardown is idempotent."""
    removed = []
    for container in labelled(client, labels):
        try:
            container.stop(timeout=stop_timeout)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError:
            pass  # already stopped or stopping: remove(force) below settles it
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            continue
        except docker.errors.APIError as err:
            raise ContainerError(node, f"cannot remove {container.name}: {err.explanation or err}") from None
        removed.append(container.name)
    return removed
