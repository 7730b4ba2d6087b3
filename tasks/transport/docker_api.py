"""A docker SDK client per node, tunnelled over the node's pinned SSH connection.

docker-py's own ssh:// support reads ~/.ssh/config and the user's known_hosts; this one
reuses SSHTransport's connection, so the Docker API gets exactly the same host-key policy
and credentials as every other command.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import docker
from docker.transport import SSHHTTPAdapter

from k3deploy.core.errors import ConnectionFault
from k3deploy.tasks.transport.ssh import SSHTransport

if TYPE_CHECKING:
    from docker.transport.sshconn import SSHConnectionPool

# The oldest API version docker-py accepts; only used until the engine reports its own.
_BOOTSTRAP_API_VERSION = "1.24"


class _PinnedSSHAdapter(SSHHTTPAdapter):
    """docker-py's SSH adapter on top of an already verified paramiko connection."""

    def __init__(self, transport: SSHTransport, timeout: int) -> None:
        self._k3_transport = transport
        # shell_out=True keeps the parent from building its own paramiko client.
        super().__init__(f"ssh://{transport.address}", timeout=timeout, shell_out=True)
        self.ssh_client = transport.connect()

    def _connect(self) -> None:
        # Called by the parent when the connection dropped: reconnect through the pinned transport.
        self.ssh_client = self._k3_transport.connect()

    def get_connection(self, url: str | bytes, proxies: Mapping[str, str] | None = None) -> SSHConnectionPool:
        transport = self.ssh_client.get_transport() if self.ssh_client else None
        if transport is None or not transport.is_active():
            # types-docker declares `pools` an int; it is urllib3's RecentlyUsedContainer.
            with self.pools.lock:  # type: ignore[attr-defined]
                self.pools.clear()  # type: ignore[attr-defined]
            self._connect()
        return super().get_connection(url, proxies)


def docker_client(transport: SSHTransport, timeout: int = 120) -> docker.DockerClient:
    """A DockerClient talking to the node's engine through `docker system dial-stdio` over SSH."""
    api = docker.APIClient(
        base_url=f"ssh://{transport.address}", version=_BOOTSTRAP_API_VERSION, timeout=timeout, use_ssh_client=True
    )
    adapter = _PinnedSSHAdapter(transport, timeout)
    # docker-py's private attributes (not in types-docker): what APIClient.__init__ sets up for its own ssh adapter.
    api._custom_adapter = adapter  # type: ignore[attr-defined]
    api.mount("http+docker://ssh", adapter)
    try:
        api._version = api._retrieve_server_version()  # type: ignore[attr-defined]
    except docker.errors.DockerException as err:
        raise ConnectionFault(
            transport.host, f"no Docker API over SSH (is docker/podman running and `docker` on PATH?): {err}"
        ) from None
    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = api
    return client
