"""Prefect tasks of the image stage: thin wrappers over the engine operations, the build and the probes."""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import docker
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.cluster import ClusterConfig
from k3deploy.blocks.image import ImageConfig
from k3deploy.blocks.serve import ContainerSettings
from k3deploy.core.errors import TransportError
from k3deploy.core.stage import Finding
from k3deploy.tasks import environment
from k3deploy.tasks.image import build as building
from k3deploy.tasks.image.engine import ImageError, NodeImage, inspect, pull, run_in_image
from k3deploy.tasks.image.probe import (
    PIP_SHOW,
    SERVE_HELP,
    Choices,
    parse_pip_show,
    registry_names,
    serve_choices,
    version_findings,
)
from k3deploy.tasks.render import entry_argv
from k3deploy.tasks.transport.base import CommandResult, Transport, on_every_node, run_all
from k3deploy.tasks.transport.factory import docker_clients, open_transports

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass
class ImageRecord:
    """What the stage establishes: the image every node runs and where it came from."""

    ref: str
    image_id: str = ""
    digest: str | None = None
    source_revision: str | None = None
    vllm_commit: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)  # node → image id
    findings: list[Finding] = field(default_factory=list)


@task(name="pull image", cache_policy=NO_CACHE)
def pull_image(cluster: ClusterConfig, image: ImageConfig) -> dict[str, NodeImage]:
    """Pull the pinned reference on every node in parallel (or, by pull_policy, use what is there)."""
    logger = get_run_logger()
    ref = image.pinned_ref

    def one(node: str, client: docker.DockerClient) -> NodeImage:
        if image.pull_policy != "always":
            with contextlib.suppress(ImageError):
                return inspect(client, node, ref)
            if image.pull_policy == "never":
                raise ImageError(node, f"no image {ref} on the node, and image.pull_policy is never")
        held = pull(client, node, ref, image.registry)
        logger.info("%s: %s is image %s", node, ref, held.id[:19])
        return held

    with docker_clients(cluster) as clients:
        return on_every_node(clients, one, "the image stage")


@task(name="build image", cache_policy=NO_CACHE)
def build_image(cluster: ClusterConfig, image: ImageConfig) -> tuple[dict[str, NodeImage], str, str, str | None]:
    """Build on the build host, then copy the image to the others; (images, source rev, VLLM_COMMIT, digest)."""
    assert image.build is not None
    build = image.build
    logger = get_run_logger()
    host = build.build_host or cluster.nodes[0].name

    def show(node: str, stream: str, line: str) -> None:
        logger.info("%s build: %s", node, line)

    with open_transports(cluster) as transports:
        builder = transports[host]
        try:
            checkout = builder.run(building.checkout_command(build), timeout=1800).check()
            try:
                source, vllm_commit = building.parse_checkout(checkout.stdout)
            except building.UnreadableCheckout as err:
                raise ImageError(host, f"checking out {build.repo_url}: {err}") from None
            logger.info("%s: vllm-ascend %s at %s, VLLM_COMMIT %s", host, build.repo_url, source, vllm_commit)
            builder.run(building.build_command(build, vllm_commit, source), timeout=4 * 3600, on_output=show).check()
            digest = None
            if build.push_repository:
                pushed = builder.run(building.push_commands(build.tag, build.push_repository), timeout=3600).check()
                found = DIGEST.findall(pushed.stdout + pushed.stderr)
                if not found:
                    what = f"pushed {build.tag} to {build.push_repository} but the engine named no digest"
                    raise ImageError(host, what)
                digest = found[-1]
        finally:  # a failed build must not leave its checkout behind either
            try:
                builder.run(building.cleanup_command(build), timeout=600).check()
            except TransportError as exc:
                logger.warning("%s: could not remove the checkout %s: %s", host, building.work_dir(build), exc)
    with docker_clients(cluster) as clients:
        built = inspect(clients[host], host, build.tag)
        others = {n: c for n, c in clients.items() if n != host}
        if digest is not None:
            pinned = f"{build.push_repository}@{digest}"

            def copy(node: str, client: docker.DockerClient) -> NodeImage:
                return pull(client, node, pinned, image.registry)
        else:

            def copy(node: str, client: docker.DockerClient) -> NodeImage:
                return _copy(clients[host], client, node, build.tag)

        copies = on_every_node(others, copy, "the image stage")
    return {host: built, **copies}, source, vllm_commit, digest


def _copy(source: docker.DockerClient, target: docker.DockerClient, node: str, tag: str) -> NodeImage:
    """docker save on the build host streamed into docker load on the node, through this machine."""
    try:
        target.images.load(source.api.get_image(tag))
    except docker.errors.APIError as err:
        raise ImageError(node, f"loading {tag} from the build host failed: {err.explanation or err}") from None
    return inspect(target, node, tag)


def _probe_key(context: Any, parameters: dict[str, Any]) -> str:
    return f"probe-image-v2-{parameters['image_id']}"  # what is inside an image id never changes


@task(name="probe image", cache_key_fn=_probe_key, persist_result=True)
def probe_image(
    cluster: ClusterConfig, image_id: str, container: ContainerSettings
) -> tuple[dict[str, str], Choices, list[Finding]]:
    """pip show vllm vllm-ascend, and the names vllm serve knows for its tokenizer mode and parsers, inside the
    image on node 0, started as launch starts vllm serve: the image's environment scripts sourced first, its
    devices and mounts given. Facts of the image only (cached by its id); the config is judged against them."""
    node = cluster.nodes[0].name
    scripts, devices, mounts = container.setup_scripts, container.devices, container.mounts
    with docker_clients(cluster, only=[node]) as clients:
        client = clients[node]
        _, shown = run_in_image(client, node, image_id, entry_argv(scripts, PIP_SHOW), 120, devices, mounts)
        code, help_text = run_in_image(client, node, image_id, entry_argv(scripts, SERVE_HELP), 120, devices, mounts)
    versions = parse_pip_show(shown)
    findings = version_findings(versions)
    if code != 0:
        findings.append(Finding("image", "vllm serve --help", False, f"exit {code}: {help_text.strip()[-200:]}"))
    return versions, serve_choices(help_text) if code == 0 else {}, findings


@task(name="provision environment", cache_policy=NO_CACHE)
def provision_environment(cluster: ClusterConfig, image: ImageConfig) -> ImageRecord:
    """The process runtime's environment on every node (node 0 first: nodes may share a host), then
    proof that every node has the same one (an id of its pip freeze)."""
    env = image.environment
    logger = get_run_logger()
    record = ImageRecord(ref=env.path)

    def show(node: str, stream: str, line: str) -> None:
        if line.strip():
            logger.info("%s: %s", node, line.rstrip())

    def make(node: str, transport: Transport) -> None:
        transport.run(environment.provision_script(env), timeout=env.timeout_s, on_output=show).check()

    with open_transports(cluster) as transports:
        first = next(iter(transports))
        make(first, transports[first])
        on_every_node({n: t for n, t in transports.items() if n != first}, make, "the image stage")
        frozen = run_all(transports, environment.freeze_command(env), timeout=300)
    for node, result in frozen.items():
        if not isinstance(result, CommandResult) or not result.ok:
            raise ImageError(node, f"cannot list the environment {env.path}: {result}")
        record.nodes[node] = environment.environment_id(result.stdout)
    record.findings = environment.identity_findings(record.nodes)
    record.image_id = next(iter(record.nodes.values()))
    return record


def _environment_key(context: Any, parameters: dict[str, Any]) -> str:
    """What an environment id holds never changes; the id is its packages, so its path is in the key too (two
    folders of the same packages may serve differently: the tests' stand-in wraps the real environment's)."""
    path = str(parameters["image"].environment.path)
    return f"probe-environment-v2-{parameters['environment_id']}-{hashlib.sha256(path.encode()).hexdigest()[:12]}"


@task(name="probe environment", cache_key_fn=_environment_key, persist_result=True)
def probe_environment(
    cluster: ClusterConfig, image: ImageConfig, environment_id: str
) -> tuple[dict[str, str], Choices, list[Finding]]:
    """pip show, and the names vllm serve knows for its tokenizer mode and parsers (its reasoning-parser registry
    where the help lists none), in node 0's environment: facts of the environment, cached by its id."""
    env = image.environment
    with open_transports(cluster) as transports:
        node0 = next(iter(transports.values()))
        shown = node0.run(environment.pip_show_command(env), timeout=300)
        helped = node0.run(environment.serve_help_command(env), timeout=600)
        registry = node0.run(environment.reasoning_registry_command(env), timeout=600)
    versions = parse_pip_show(shown.stdout)
    findings = version_findings(versions, environment.requirement_names(env))
    if helped.exit_code != 0:
        findings.append(Finding("image", "vllm serve --help", False, helped.stderr.strip()[-200:]))
        return versions, {}, findings
    return versions, serve_choices(helped.stdout, registry_names(registry.stdout)), findings
