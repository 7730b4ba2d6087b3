"""Transports to the nodes: one interface, an SSH and a local implementation, and Docker over SSH."""

from k3deploy.tasks.transport.base import (
    CommandInterrupted,
    CommandResult,
    RetryPolicy,
    Transport,
    run_all,
    run_idempotent,
    run_once,
)
from k3deploy.tasks.transport.docker_api import docker_client
from k3deploy.tasks.transport.factory import transports_for
from k3deploy.tasks.transport.local import LocalTransport
from k3deploy.tasks.transport.ssh import SSHTransport

__all__ = [
    "CommandInterrupted",
    "CommandResult",
    "LocalTransport",
    "RetryPolicy",
    "SSHTransport",
    "Transport",
    "docker_client",
    "run_all",
    "run_idempotent",
    "run_once",
    "transports_for",
]
