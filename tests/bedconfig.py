"""Deployment documents for the test bed: the reference config pointed at the bed's hosts and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from k3deploy.tasks.transport import SSHTransport
from tests.configs import site_data, with_changes


def bed_config(bed: Any, hosts: int | list[str] = 4, **changes: Any) -> dict[str, Any]:
    """The reference deployment on bed hosts (the first N, or those named), nic eth0, model root /srv/models."""
    chosen = bed.hosts[:hosts] if isinstance(hosts, int) else [bed.host(name) for name in hosts]
    data = site_data()
    data["cluster"]["model_root"] = "/srv/models"
    data["cluster"]["ssh"] = {
        "user": "root",
        "known_hosts": str(bed.known_hosts),
        "private_key_file": str(bed.key),
        "connect_timeout_s": 10,
    }
    data["cluster"]["nodes"] = [{"name": h.name, "address": h.ip, "nic": "eth0"} for h in chosen]
    data["serve"]["data_parallel_size"] = len(chosen)
    data["serve"]["expert_parallel_size"] = len(chosen) * data["serve"]["tensor_parallel_size"]
    return with_changes(data, **changes)


def bed_transports(bed: Any, hosts: int = 4) -> dict[str, SSHTransport]:
    """SSH to the first bed hosts with the bed key and pinned host keys, keyed by node name."""
    return {
        h.name: SSHTransport(h.ip, name=h.name, private_key_file=bed.key, known_hosts=bed.known_hosts)
        for h in bed.hosts[:hosts]
    }


# No test waits for a cluster without a bound (the product's default waits as long as it takes).
BUSY_TIMEOUT_S = 600


def write_config(path: Path, data: dict[str, Any]) -> str:
    """The document as a test's YAML file; its runs give up waiting for the cluster after BUSY_TIMEOUT_S."""
    cluster = data.get("cluster")
    if isinstance(cluster, dict) and "busy_timeout_s" not in cluster:
        data = {**data, "cluster": {**cluster, "busy_timeout_s": BUSY_TIMEOUT_S}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)
