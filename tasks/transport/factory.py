"""Transports for the nodes of a deployment, chosen by cluster.transport."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator

import docker

from k3deploy.blocks.cluster import ClusterConfig
from k3deploy.tasks.transport.base import Transport
from k3deploy.tasks.transport.docker_api import docker_client
from k3deploy.tasks.transport.local import LocalTransport
from k3deploy.tasks.transport.ssh import SSHTransport


def transports_for(cluster: ClusterConfig) -> dict[str, Transport]:
    """One transport per node, keyed by node name, node 0 first."""
    if cluster.transport == "local":
        return {node.name: LocalTransport(node.name) for node in cluster.nodes}
    ssh = cluster.ssh
    return {
        node.name: SSHTransport(
            node.address,
            name=node.name,
            user=ssh.user,
            port=ssh.port,
            known_hosts=ssh.known_hosts,
            private_key=ssh.private_key,
            private_key_file=ssh.private_key_file,
            connect_timeout=ssh.connect_timeout_s,
            trust_new_hosts=ssh.trust_new_hosts,
        )
        for node in cluster.nodes
    }


@contextlib.contextmanager
def open_transports(cluster: ClusterConfig) -> Iterator[dict[str, Transport]]:
    """transports_for, closed again however the block ends (SSH connections are reused inside it)."""
    transports = transports_for(cluster)
    try:
        yield transports
    finally:
        for transport in transports.values():
            transport.close()


@contextlib.contextmanager
def docker_clients(
    cluster: ClusterConfig, only: Collection[str] | None = None
) -> Iterator[dict[str, docker.DockerClient]]:
    """A docker client per node (or per node in `only`): over the pinned SSH connection, or this
    machine's engine for `local`."""
    clients: dict[str, docker.DockerClient] = {}
    with open_transports(cluster) as transports:
        try:
            for name, transport in transports.items():
                if only is not None and name not in only:
                    continue
                clients[name] = (
                    docker_client(transport) if isinstance(transport, SSHTransport) else docker.from_env(timeout=120)
                )
            yield clients
        finally:
            for client in clients.values():
                with contextlib.suppress(Exception):
                    client.close()
