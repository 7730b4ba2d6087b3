"""Transports to the nodes: one interface, an SSH and a local implementation, and Docker over SSH."""

from tasks.transport.base import CommandResult, Transport, run_all
from tasks.transport.docker_api import docker_client
from tasks.transport.factory import transports_for
from tasks.transport.local import LocalTransport
from tasks.transport.ssh import SSHTransport

__all__ = [
    "CommandResult",
    "LocalTransport",
    "SSHTransport",
    "Transport",
    "docker_client",
    "run_all",
    "transports_for",
]
