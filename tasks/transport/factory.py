"""Transports for the nodes of a deployment, chosen by cluster.transport."""

from __future__ import annotations

from blocks.cluster import ClusterConfig
from tasks.transport.base import Transport
from tasks.transport.local import LocalTransport
from tasks.transport.ssh import SSHTransport


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
