"""The nodes of the deployment and how to reach them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from k3deploy.blocks._types import AbsPath, HostAddress, InterfaceName, IPAddress, Name, StrictBlock, Text

CommPlane = Literal["roce", "hccs"]
COMM_PLANES: tuple[CommPlane, ...] = ("roce", "hccs")


class NodeSpec(BaseModel):
    """One host of the cluster; node 0 is the first in the list."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="Short name used in logs, tables and container labels, e.g. node0.")
    address: HostAddress = Field(description="IP address or host name k3deploy reaches the node at over SSH.")
    local_ip: IPAddress | None = Field(
        default=None,
        description="The node's IP on the serving network (LOCAL_IP, HCCL_IF_IP); defaults to address.",
    )
    nic: InterfaceName = Field(description="Network interface that owns local_ip (NIC_NAME, *_SOCKET_IFNAME).")

    @property
    def serving_ip(self) -> str:
        return self.local_ip or self.address


class SSHSettings(BaseModel):
    """How to log in; the key itself is a secret and never part of a plan or a record."""

    model_config = ConfigDict(extra="forbid")

    user: Text = Field(default="root", description="Login user on every node.")
    port: int = Field(default=22, ge=1, le=65535, description="sshd port on every node.")
    known_hosts: Text = Field(
        default="~/.ssh/known_hosts",
        description="known_hosts file that pins every node's host key; unknown keys are refused.",
    )
    private_key_file: Text | None = Field(
        default=None, description="Path of the private key on the machine running k3deploy (each worker host)."
    )
    private_key: SecretStr | None = Field(
        default=None,
        description="The private key itself (PEM/OpenSSH text); or set K3DEPLOY_SSH_PRIVATE_KEY. In a saved block "
        "the Prefect server keeps it for whoever holds its auth string: prefer private_key_file.",
    )
    connect_timeout_s: float = Field(
        default=10.0, gt=0, description="Time to get a connection, retries on connection faults included."
    )
    trust_new_hosts: bool = Field(
        default=False,
        description="Accept and record the key of a node missing from known_hosts; a changed key is always refused.",
    )


class ClusterConfig(StrictBlock):
    """Nodes, their NPUs and the shared model root."""

    _block_type_name = "k3deploy cluster"

    name: Name | None = Field(
        default=None,
        description="The cluster's name. Runs on one cluster take turns (a Prefect concurrency limit "
        "k3deploy-cluster-<name>); default: node 0's address and a hash of every node's.",
    )
    on_busy: Literal["enqueue", "refuse"] = Field(
        default="enqueue",
        description="When another run holds the cluster: wait for it (enqueue) or fail at once naming it (refuse).",
    )
    busy_timeout_s: float | None = Field(
        default=None, gt=0, description="enqueue: give up after waiting this long; null waits as long as it takes."
    )
    hold_beat_s: float = Field(
        default=15.0,
        ge=1,
        le=15,
        description="How often the run holding the cluster renews its hold (at most 15: Prefect's shortest lease is "
        "60 s). A hold not renewed for 4 beats belongs to a dead run: the next run takes it over.",
    )
    transport: Literal["ssh", "local"] = Field(
        default="ssh", description="ssh for real nodes; local runs every node's work on this machine."
    )
    nodes: list[NodeSpec] = Field(min_length=1, description="The nodes, node 0 (the serving node) first.")
    npus_per_node: int = Field(
        default=16,
        ge=0,
        description=(
            "Logical NPUs offered by each node; 0 declares no NPUs: the NPU checks of comm and preflight do not apply."
        ),
    )
    comm_planes: list[CommPlane] = Field(
        default_factory=lambda: list(COMM_PLANES),
        min_length=1,
        description="The NPU networks comm checks: roce (hccn_tool link, IP, gateway, pings) and hccs (vNIC, "
        "spod-info, hccs_ping; A3 boards). Super-pod sites that run HCCS only leave roce out.",
    )
    model_root: AbsPath = Field(
        description="Folder holding every checkpoint, mounted at the same path in each container."
    )
    model_root_shared: bool = Field(
        default=False,
        description="True when model_root is shared storage: download once instead of on every node.",
    )
    ssh: SSHSettings = Field(default_factory=SSHSettings, description="SSH login settings.")
