"""Names, addresses and the state file of the test bed.

Everything the bed creates is derived from here, so `down` can find and remove
it even when the state file is gone. All addresses live in 10.213.0.0/16, which
the bed routes onto its own bridge: nothing it names can leave this machine.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .npusim.model import NPUS_PER_HOST, BedMap, HostEntry, Npu

STATE_ENV = "K3DEPLOY_TESTBED_STATE"
DEFAULT_STATE_DIR = Path("/run/k3deploy-testbed")
STATE_FILE_NAME = "testbed.json"
STATE_VERSION = 1

BRIDGE = "k3tb0"
BRIDGE_IP = "10.213.0.1"
PREFIX_LEN = 24
SUPERNET = "10.213.0.0/16"
NETNS_PREFIX = "k3tb-node"
VETH_PREFIX = "k3tb-v"
LINK_PREFIX = "k3tb"
HOST_IP_BASE = 10
MAX_HOSTS = 64
SSH_PORT = 22
SSH_USER = "root"
REGISTRY_PORT = 5000
REGISTRY = f"{BRIDGE_IP}:{REGISTRY_PORT}"
IMAGE_REPO = f"{REGISTRY}/k3deploy/testimg"
IMAGE_TAG = "1"
MODEL_ROOT = "/srv/models"
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# NPU addressing: NPU j of every host shares a /24 (as RoCE planes usually do),
# host i is .10+i in it. NIC (RoCE, `-ip -g`) and vNIC (HCCS, `-vnic -g`) differ.
NPU_NIC_NET = 64
NPU_VNIC_NET = 96


def host_name(index: int) -> str:
    return f"node{index}"


def host_ip(index: int) -> str:
    return f"10.213.0.{HOST_IP_BASE + index}"


def netns_name(index: int) -> str:
    return f"{NETNS_PREFIX}{index}"


def veth_name(index: int) -> str:
    return f"{VETH_PREFIX}{index}"


def npu_addresses(index: int) -> tuple[Npu, ...]:
    """The 16 NPUs of host `index`; addresses are unique across the bed."""
    return tuple(
        Npu(
            id=j,
            ip=f"10.213.{NPU_NIC_NET + j}.{HOST_IP_BASE + index}",
            vnic_ip=f"10.213.{NPU_VNIC_NET + j}.{HOST_IP_BASE + index}",
            gateway=f"10.213.{NPU_NIC_NET + j}.1",
        )
        for j in range(NPUS_PER_HOST)
    )


def leases_dir(state_dir: Path) -> Path:
    """Where the pytest plugin's sessions record that they use the bed (beside the state dir)."""
    return state_dir.parent / f"{state_dir.name}.leases"


def live_leases(leases: Path) -> list[Path]:
    """The leases whose session (a pid) is still running."""
    return [p for p in leases.glob("[0-9]*") if Path(f"/proc/{p.name}").exists()]


def resolve_state_file(state_dir: str | os.PathLike[str] | None = None) -> Path:
    """`--state-dir` wins, then $K3DEPLOY_TESTBED_STATE (a file path), then the default."""
    if state_dir is not None:
        return Path(state_dir).resolve() / STATE_FILE_NAME
    env = os.environ.get(STATE_ENV)
    if env:
        return Path(env).resolve()
    return DEFAULT_STATE_DIR / STATE_FILE_NAME


@dataclass
class HostState:
    """One test host as recorded in the state file."""

    name: str
    index: int
    hostname: str
    ip: str
    port: int
    user: str
    netns: str
    dir: str
    podman_socket: str
    docker_url: str
    faults_file: str
    srv_dir: str
    model_root: str
    npus: list[dict[str, Any]] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)


@dataclass
class BedState:
    """The whole bed: what tests and later stages read from the state file."""

    version: int
    created: str
    state_dir: str
    state_file: str
    bridge: dict[str, Any]
    ssh: dict[str, Any]
    registry: dict[str, Any]
    image: dict[str, Any]
    npu_sim: dict[str, Any]
    hosts: list[HostState]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> BedState:
        data = json.loads(text)
        data["hosts"] = [HostState(**h) for h in data["hosts"]]
        return cls(**data)


def load_state(path: str | os.PathLike[str] | None = None) -> BedState:
    """Read the state file of a running bed (raises FileNotFoundError if none)."""
    file = Path(path) if path is not None else resolve_state_file()
    return BedState.from_json(file.read_text())


def write_state(state: BedState) -> None:
    """Write the state file atomically so a reader never sees half of it."""
    file = Path(state.state_file)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(state.to_json())
    tmp.replace(file)


def bed_map(count: int, state_dir: Path) -> BedMap:
    """The NPU map every host's simulator reads."""
    return BedMap(
        hosts=tuple(
            HostEntry(
                name=host_name(i),
                index=i,
                ip=host_ip(i),
                faults_path=str(state_dir / "hosts" / host_name(i) / "npu-sim" / "faults.json"),
                npus=npu_addresses(i),
            )
            for i in range(count)
        )
    )
