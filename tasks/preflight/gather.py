"""The I/O of preflight: each node's host key, its command facts as one batched script, its engine.

Host keys are read first, from the pinned connection itself, so a node that is unreachable or
offers a changed key fails `ssh` and is asked nothing more, while every other node is still
read. All nodes are read at once; nothing here raises for a single node's fault.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import paramiko
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import CommandTimeout, K3DeployError, TransportError
from k3deploy.tasks.batch import Section, first_line, parse_output, render_script
from k3deploy.tasks.preflight.evaluate import FactResult, NodeOutputs, evaluate_node
from k3deploy.tasks.preflight.facts import COMMAND_FACTS, LOCAL_HOST_KEY, engine_applies
from k3deploy.tasks.render import NODE_LABEL
from k3deploy.tasks.runtime import node_runtime
from k3deploy.tasks.transport.base import Transport, run_all
from k3deploy.tasks.transport.factory import docker_clients, open_transports
from k3deploy.tasks.transport.ssh import SSHTransport, openssh_fingerprint

SCRIPT_TIMEOUT_S = 60.0  # the whole facts script of one node
SECTION_TIMEOUT_S = 20.0  # one command in it (a hung npu-smi costs its fact, not the node's report)
_ENGINE_FAULTS = (K3DeployError, docker.errors.DockerException, OSError, paramiko.SSHException)


def host_key(transport: Transport) -> tuple[str, str]:
    """(key type, fingerprint) of the key the node proved it holds on the pinned connection.

    Connecting is what checks the key against known_hosts: HostKeyError on a changed or unknown key.
    """
    if not isinstance(transport, SSHTransport):
        return "", LOCAL_HOST_KEY
    connection = transport.connect().get_transport()
    if connection is None:  # connect() returns only an active connection; be explicit all the same
        raise TransportError(transport.host, "SSH connection closed before its host key was read")
    key = connection.get_remote_server_key()
    return key.get_name(), openssh_fingerprint(key.asbytes())


def host_key_fingerprint(transport: Transport) -> str:
    """The node's host key as OpenSSH prints it (`SHA256:…`), or LOCAL_HOST_KEY for a local node."""
    return host_key(transport)[1]


def _message(err: TransportError) -> str:
    """The error without its `node: ` prefix (the finding names the node already)."""
    return str(err).removeprefix(f"{err.host}: ")


def read_host_keys(transports: Mapping[str, Transport]) -> dict[str, NodeOutputs]:
    """Every node's host key at once; an unreachable or untrusted node gets its ssh_error instead."""
    out = {name: NodeOutputs(name) for name in transports}
    with ThreadPoolExecutor(max_workers=max(1, len(transports))) as pool:
        futures = {name: pool.submit(host_key, t) for name, t in transports.items()}
    for name, future in futures.items():
        try:
            out[name].host_key_type, out[name].host_key = future.result()
        except TransportError as err:
            out[name].ssh_error = _message(err)
    return out


def node_sections(cfg: DeploymentConfig, index: int) -> list[Section]:
    """The command facts that apply to node `index`, one batch section each, keyed by fact name."""
    return [Section(f.name, tuple(argv)) for f in COMMAND_FACTS if (argv := f.command(cfg, index))]


def run_fact_scripts(
    cfg: DeploymentConfig,
    transports: Mapping[str, Transport],
    outputs: Mapping[str, NodeOutputs],
    timeout: float = SCRIPT_TIMEOUT_S,
    section_timeout: float = SECTION_TIMEOUT_S,
) -> None:
    """One script per reachable node, all at once; fills each node's sections or its batch_error."""
    index = {node.name: i for i, node in enumerate(cfg.cluster.nodes)}
    token = secrets.token_hex(8)
    plans = {name: node_sections(cfg, index[name]) for name in transports if outputs[name].ssh_error is None}
    scripts = {
        name: render_script(plan, token, parallel=len(plan), section_timeout=section_timeout)
        for name, plan in plans.items()
        if plan
    }
    # Only reads the node: a connection that drops mid-script is reconnected and the script run again.
    targets = {name: transports[name] for name in scripts}
    results = (
        run_all(targets, scripts, timeout, idempotent=True, purpose="reading the preflight facts") if targets else {}
    )
    for name, result in results.items():
        got = outputs[name]
        if isinstance(result, CommandTimeout):
            got.batch_error = f"the facts script did not finish within {timeout:g}s"
        elif isinstance(result, TransportError):
            got.batch_error = _message(result)
        else:
            got.sections = parse_output(plans[name], result.stdout, token)
            if not got.sections and result.exit_code != 0:
                why = first_line(result.stderr or result.stdout)
                got.batch_error = f"the facts script exited {result.exit_code}: {why}"


def engine_version(cfg: DeploymentConfig, node: str) -> dict[str, Any]:
    """The docker SDK's `version()` answer from the node's engine, over the node's pinned SSH connection."""
    with docker_clients(cfg.cluster, only=[node]) as clients:
        return dict(clients[node].version())


def read_engines(cfg: DeploymentConfig, outputs: Mapping[str, NodeOutputs]) -> None:
    """Every reachable node's engine version at once; a node whose engine does not answer gets engine_error."""
    nodes = [name for name, got in outputs.items() if got.ssh_error is None]
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        futures = {name: pool.submit(engine_version, cfg, name) for name in nodes}
    for name, future in futures.items():
        try:
            outputs[name].engine = future.result()
        except _ENGINE_FAULTS as err:
            text = _message(err) if isinstance(err, TransportError) else f"{type(err).__name__}: {err}"
            outputs[name].engine_error = first_line(text)


def read_own_servers(cfg: DeploymentConfig, outputs: Mapping[str, NodeOutputs]) -> None:
    """The running servers of k3deploy's own on node 0, whose ports launch adopts or refuses by name (a
    `--keep-serving` run's, a tune cell's left by a killed tune); unread (None) when the runtime does not answer."""
    node = cfg.cluster.nodes[0].name
    got = outputs[node]
    if got.ssh_error is not None:
        return
    try:
        with node_runtime(cfg, node) as runtime:
            got.own_servers = runtime.names({NODE_LABEL: node}, running_only=True)
    except _ENGINE_FAULTS:
        got.own_servers = None  # the ports stay judged as anyone's


def gather_outputs(cfg: DeploymentConfig, transports: Mapping[str, Transport]) -> dict[str, NodeOutputs]:
    """Host keys first, then the facts script and the engine of every node whose key checked out."""
    missing = [n.name for n in cfg.cluster.nodes if n.name not in transports]
    if missing:
        raise ValueError(f"no transport for node(s): {', '.join(missing)}")
    outputs = read_host_keys({n.name: transports[n.name] for n in cfg.cluster.nodes})
    run_fact_scripts(cfg, transports, outputs)
    if engine_applies(cfg):
        read_engines(cfg, outputs)
    read_own_servers(cfg, outputs)
    return outputs


@task(name="gather node facts", cache_policy=NO_CACHE)  # never cached: it is what checks the host keys
def gather_node_facts(cfg: DeploymentConfig) -> dict[str, list[FactResult]]:
    """Every fact of every node, judged; failures are results, never exceptions."""
    with open_transports(cfg.cluster) as transports:
        outputs = gather_outputs(cfg, transports)
    results = {node.name: evaluate_node(cfg, i, outputs[node.name]) for i, node in enumerate(cfg.cluster.nodes)}
    logger = get_run_logger()
    for node, facts in results.items():
        bad = [f.fact for f in facts if not f.ok]
        logger.info("%s: %s", node, f"failed {', '.join(bad)}" if bad else f"{len(facts)} facts read")
    return results
