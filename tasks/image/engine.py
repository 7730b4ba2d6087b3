"""Image operations on one node's engine through the docker SDK (over the pinned SSH connection)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import requests

from k3deploy.blocks.image import RegistryAuth
from k3deploy.core.errors import NodeError

PROBE_LABEL = "k3deploy.probe"


class ImageError(NodeError):
    """An image could not be pulled, found, built or run on a node."""


@dataclass(frozen=True)
class NodeImage:
    """The image a node holds for the configured reference."""

    node: str
    ref: str
    id: str
    repo_digests: tuple[str, ...]

    def digest_of(self, repository: str) -> str | None:
        """The registry digest recorded for `repository` (what a pull by tag resolved to)."""
        for entry in self.repo_digests:
            name, _, digest = entry.partition("@")
            if name == repository:
                return digest
        return None


def split_ref(ref: str) -> tuple[str, str | None, str | None]:
    """'reg:5000/org/name:tag@sha256:…' → (repository, tag, digest); a port is not a tag."""
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :], digest or None
    return name, None, digest or None


def _auth(registry: RegistryAuth | None) -> dict[str, str] | None:
    if registry is None or registry.password is None:
        return None
    return {"username": registry.username, "password": registry.password.get_secret_value()}


def pull(
    client: docker.DockerClient,
    node: str,
    ref: str,
    registry: RegistryAuth | None = None,
    on_progress: Callable[[str, dict[str, Any]], None] | None = None,
) -> NodeImage:
    """Pull `ref` (by digest when it has one) and return what the node now holds."""
    repository, tag, digest = split_ref(ref)
    try:
        for event in client.api.pull(
            repository, tag=digest or tag or "latest", stream=True, decode=True, auth_config=_auth(registry)
        ):
            if "error" in event:
                detail = event.get("errorDetail", {}).get("message") or event["error"]
                raise ImageError(node, f"pulling {ref} failed: {detail}")
            if on_progress is not None:
                on_progress(node, event)
    except docker.errors.APIError as err:
        raise ImageError(node, f"pulling {ref} failed: {err.explanation or err}") from None
    return inspect(client, node, ref)


def inspect(client: docker.DockerClient, node: str, ref: str) -> NodeImage:
    """The image `ref` names on the node, or ImageError when the node has none."""
    try:
        image = client.images.get(ref)
    except docker.errors.ImageNotFound:
        raise ImageError(node, f"no image {ref} on the node") from None
    except docker.errors.APIError as err:
        raise ImageError(node, f"cannot inspect {ref}: {err.explanation or err}") from None
    if image.id is None:  # the SDK types it optional; an inspected image always has one
        raise ImageError(node, f"the engine reports no id for {ref}")
    return NodeImage(node, ref, image.id, tuple(image.attrs.get("RepoDigests") or ()))


@contextlib.contextmanager
def _probe_container(
    client: docker.DockerClient, image_id: str, argv: list[str], devices: Sequence[str], volumes: Sequence[str]
) -> Iterator[Any]:
    extra: dict[str, Any] = {"devices": list(devices)} if devices else {}
    if volumes:
        extra["volumes"] = list(volumes)
    container = client.containers.create(image_id, command=argv, entrypoint=[], labels={PROBE_LABEL: "1"}, **extra)
    try:
        yield container
    finally:
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)  # never leave a probe container behind


def run_in_image(
    client: docker.DockerClient,
    node: str,
    image_id: str,
    argv: list[str],
    timeout: float = 120,
    devices: Sequence[str] = (),
    volumes: Sequence[str] = (),
) -> tuple[int, str]:
    """Run a short command in a throw-away container of the image, with the serving container's devices and
    mounts (vLLM-Ascend's plugin reads the driver through them): (exit code, stdout + stderr)."""
    try:
        with _probe_container(client, image_id, argv, devices, volumes) as container:
            container.start()
            status = container.wait(timeout=timeout)
            output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    except docker.errors.APIError as err:
        raise ImageError(node, f"cannot run {argv[0]!r} in {image_id[:19]}: {err.explanation or err}") from None
    except requests.exceptions.RequestException as err:
        # wait() ran out; over SSH docker-py reports that as ConnectionError("… Read timed out.")
        if isinstance(err, requests.exceptions.ReadTimeout) or "timed out" in str(err).lower():
            raise ImageError(node, f"{' '.join(argv)} did not finish within {timeout:g}s in the image") from None
        raise
    return int(status.get("StatusCode", -1)), output
