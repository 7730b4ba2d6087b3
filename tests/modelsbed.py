"""Helpers of the models stage's bed tests: run the flow on bed hosts, read what the hub and the nodes saw."""

from __future__ import annotations

import random
import shlex
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from k3deploy.core.stage import StageResult, failure_lines
from k3deploy.flows.models import models
from k3deploy.localhub import HubServer
from k3deploy.tasks.transport import SSHTransport
from tests.bedconfig import bed_config, write_config


def hub_fixture() -> Any:
    """A module's `hub` fixture: the local hub on the bed's bridge address, where every test host can reach it."""

    @pytest.fixture(scope="module")
    def hub(testbed, tmp_path_factory) -> Iterator[HubServer]:
        with HubServer(tmp_path_factory.mktemp("hub"), host=testbed.state.bridge["ip"]) as server:
            yield server

    return hub


def sh(transport: SSHTransport, command: str) -> str:
    return transport.run(command, 30).check().stdout


def shape_per_peer(transport: SSHTransport, peers: list[str], rate: str) -> None:
    """An htb class per peer address on the host's egress, so each peer gets `rate` and none outruns the others.

    One tbf for all peers let TCP hand one peer most of it: in a CI run it finished the shard between the
    test's look and the kill. Traffic to anyone else (the test's SSH) is not shaped."""
    commands = ["tc qdisc add dev eth0 root handle 1: htb"]
    for i, ip in enumerate(peers, start=1):
        commands.append(f"tc class add dev eth0 parent 1: classid 1:{i} htb rate {rate} ceil {rate}")
        commands.append(f"tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst {ip}/32 flowid 1:{i}")
    sh(transport, " && ".join(commands))


def as_record(result: StageResult) -> dict[str, Any]:
    """The stage data with its verdict and failure lines, as the tests read them."""
    return result.data | {"verdict": result.verdict.value, "problems": failure_lines(result.findings)}


def run_models(tmp_path: Path, bed, hub: HubServer, repo: str, hosts: int = 4, **changes: Any) -> dict[str, Any]:
    download = changes.pop("download", True)
    full_verify = changes.pop("full_verify", False)
    data = bed_config(
        bed,
        hosts,
        models__hub="huggingface",
        models__hub_endpoint=hub.url,
        models__target={"repo": repo, **changes.pop("target", {})},
        **changes,
    )
    config = write_config(tmp_path / f"deploy-{random.randrange(10**9)}.yaml", data)
    result = models(config=config, download=download, full_verify=full_verify)
    return as_record(result)


def file_gets(hub: HubServer, repo: str) -> list[tuple[str, str | None]]:
    """Downloads of file contents the hub served for `repo`: (file, Range header)."""
    out = []
    for r in hub.requests:
        prefix = f"/{repo}/resolve/"
        if r.method == "GET" and r.path.startswith(prefix):
            out.append((r.path[len(prefix) :].split("/", 1)[1], r.range))
    return out


def node_sha256(transport: SSHTransport, path: str) -> str:
    return sh(transport, f"sha256sum {shlex.quote(path)}").split()[0]


def poll(what: str, condition: Callable[[], bool], deadline_s: float = 60.0, every_s: float = 0.2) -> None:
    """Wait for `condition()` to hold, failing with `what` when it does not within the deadline."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s:g} s: {what}")
        time.sleep(every_s)
