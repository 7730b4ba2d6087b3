"""Prefect tasks of the models stage: thin wrappers over the listing, the node agent and the checks."""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext
from prefect.logging import get_run_logger

from k3deploy.blocks.cluster import ClusterConfig
from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.models import CheckpointSpec, ModelsConfig
from k3deploy.core.errors import K3DeployError
from k3deploy.tasks import node_facts as nf
from k3deploy.tasks.models.checks import DOCUMENTS, space_problems
from k3deploy.tasks.models.exchange import exchange_part, new_token, plan_lines, stop_command, stripe_plan
from k3deploy.tasks.models.listing import Listing, auth_headers, download_urls, list_huggingface, list_modelscope
from k3deploy.tasks.models.outcome import CheckpointOutcome, space_needs
from k3deploy.tasks.models.remote import NodeReport, ProgressBoard, job, run_agent, run_agent_each
from k3deploy.tasks.transport.base import Transport, failed_on, on_every_node
from k3deploy.tasks.transport.factory import open_transports

MODELSCOPE_ENDPOINT = "https://www.modelscope.cn"
COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint to provide: its role (target or draft), hub coordinates and path on the nodes."""

    role: str
    repo: str
    revision: str | None
    path: str


def checkpoints(models: ModelsConfig) -> list[Checkpoint]:
    specs: list[tuple[str, CheckpointSpec]] = [("target", models.target)]
    if models.draft is not None:
        specs.append(("draft", models.draft))
    return [Checkpoint(role, s.repo, s.revision, str(s.path)) for role, s in specs]


def storage_nodes(cluster: ClusterConfig) -> list[str]:
    """Nodes that hold their own copy: all of them, or node 0 alone when the model root is shared."""
    names = [n.name for n in cluster.nodes]
    return names[:1] if cluster.model_root_shared else names


def _listing_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    """Cache a listing only for a commit: a branch or tag may move between runs."""
    models: ModelsConfig = parameters["models"]
    ckpt: Checkpoint = parameters["checkpoint"]
    if not (ckpt.revision and COMMIT.fullmatch(ckpt.revision)):
        return None
    return f"listing-{models.hub}-{models.hub_endpoint}-{ckpt.repo}-{ckpt.revision}"


@task(name="list checkpoint", cache_key_fn=_listing_key, persist_result=True, retries=2, retry_delay_seconds=5)
def list_checkpoint(models: ModelsConfig, checkpoint: Checkpoint) -> Listing:
    """The hub's commit for the configured revision and every file's size and checksum."""
    if models.hub == "huggingface":
        listing = list_huggingface(checkpoint.repo, checkpoint.revision, models.hub_endpoint, models.hub_token)
    else:
        endpoint = models.hub_endpoint or MODELSCOPE_ENDPOINT
        listing = list_modelscope(checkpoint.repo, checkpoint.revision, endpoint, models.hub_token)
    get_run_logger().info(
        "%s %s@%s is commit %s: %d files, %.2f GB",
        checkpoint.role,
        checkpoint.repo,
        checkpoint.revision or "default branch",
        listing.commit,
        len(listing.files),
        listing.total_bytes / 1e9,
    )
    return listing


def _listing_digest(listing: Listing) -> str:
    rows = [f"{f.path}\0{f.size}\0{f.sha256}\0{f.git_blob}" for f in listing.files]
    return hashlib.sha256("\n".join([listing.repo, listing.commit, *rows]).encode()).hexdigest()


def _verify_key(context: TaskRunContext, parameters: dict[str, Any]) -> str:
    """Same files, same sizes and mtimes on the same nodes: the verified answer still holds."""
    cluster: ClusterConfig = parameters["cluster"]
    stats: Mapping[str, NodeReport] = parameters["stats"]
    addresses = {n.name: n.address for n in cluster.nodes}
    nodes = sorted(f"{n}@{addresses[n]}:{r.fingerprint}" for n, r in stats.items())
    blob = "\n".join([parameters["checkpoint"].path, _listing_digest(parameters["listing"]), *nodes])
    return "verify-" + hashlib.sha256(blob.encode()).hexdigest()


def _progress_reporter(title: str) -> ProgressBoard:
    """Progress to the Prefect UI (a progress artifact) and to the terminal (the run logger)."""
    logger = get_run_logger()
    artifact = create_progress_artifact(0.0, description=title)

    def report(fraction: float, text: str) -> None:
        # Prefect's async_dispatch types the id as `UUID | Coroutine`; called from sync code it is the UUID.
        update_progress_artifact(artifact, round(100 * fraction, 1), description=f"{title}: {text}")  # type: ignore[arg-type]
        logger.info("%s: %s", title, text)

    return ProgressBoard(report)


@task(name="stat checkpoint", cache_policy=NO_CACHE)
def stat_checkpoint(
    cluster: ClusterConfig, models: ModelsConfig, checkpoint: Checkpoint, listing: Listing, nodes: list[str]
) -> dict[str, NodeReport]:
    """Sizes and mtimes on each node (the cache key of the verification), bytes missing, free space."""
    body = job("stat", checkpoint.path, listing)
    with open_transports(cluster) as transports:
        what = f"looking at {checkpoint.role} {checkpoint.path}"
        return run_agent(transports, models.node_python, dict.fromkeys(nodes, body), 300, what)


@task(name="verify checkpoint", cache_key_fn=_verify_key, persist_result=True)
def verify_checkpoint(
    cluster: ClusterConfig,
    models: ModelsConfig,
    checkpoint: Checkpoint,
    listing: Listing,
    stats: dict[str, NodeReport],
    full: bool = False,
) -> dict[str, NodeReport]:
    """Hash on every node whatever its manifest cannot vouch for (everything, when `full`); the nodes write
    their manifests. A full verify is never answered from the cache (the flow refreshes it)."""
    board = _progress_reporter(f"{'fully ' if full else ''}verifying {checkpoint.role} {checkpoint.repo}")
    body = job("verify", checkpoint.path, listing, threads=models.threads, read=DOCUMENTS, full=full)
    jobs = dict.fromkeys(stats, body)
    what = f"verifying {checkpoint.role} {checkpoint.path}"
    with open_transports(cluster) as transports:
        return run_agent(transports, models.node_python, jobs, models.timeout_s, what, board.on_output)


def striped(cluster: ClusterConfig, models: ModelsConfig, wanted: Mapping[str, list[str]]) -> bool:
    """The exchange pays off, and can work, when several nodes keep their own copy."""
    return models.distribution == "stripe" and not cluster.model_root_shared and len(wanted) > 1


@task(name="fetch checkpoint", cache_policy=NO_CACHE)
def fetch_checkpoint(
    cluster: ClusterConfig,
    models: ModelsConfig,
    checkpoint: Checkpoint,
    listing: Listing,
    wanted: dict[str, list[str]],
) -> dict[str, NodeReport]:
    """Download only the missing or bad files, each node its own list, resuming what an earlier run left;
    striped (one copy through the hub, the rest from peers) unless models.distribution says per-node."""
    urls = download_urls(models.hub, listing, checkpoint.revision, models.hub_endpoint)
    extra: dict[str, Any] = {
        "threads": models.threads,
        "urls": urls,
        "headers": auth_headers(models.hub_token),
        "read": DOCUMENTS,
        "read_timeout_s": models.read_timeout_s,
        "retries": models.download_retries,
    }
    what = f"downloading {checkpoint.role} {checkpoint.repo}"
    board = _progress_reporter(what)
    with open_transports(cluster) as transports:
        taken = (
            _exchange_port_taken(transports, list(wanted), models.exchange_port)
            if striped(cluster, models, wanted)
            else None
        )
        if taken is None or taken:
            if taken:
                get_run_logger().warning(
                    "%s: each node downloads for itself: the peer exchange's port (models.exchange_port) is taken "
                    "on %s",
                    what,
                    "; ".join(f"{node} ({line})" for node, line in taken.items()),
                )
            jobs = {node: job("fetch", checkpoint.path, listing, fetch=p, **extra) for node, p in wanted.items() if p}
            return run_agent(transports, models.node_python, jobs, models.timeout_s, what, board.on_output)
        plan = stripe_plan(listing, wanted)
        token = new_token()
        addresses = {n.name: n.serving_ip for n in cluster.nodes if n.name in plan}
        parts = {node: part for node, part in plan.items() if part.fetches or part.serve_to}
        jobs = {
            node: job(
                "exchange",
                checkpoint.path,
                listing,
                exchange=exchange_part(
                    node,
                    part,
                    addresses,
                    models.exchange_port,
                    token,
                    slow_fraction=models.exchange_slow_fraction,
                    stall_s=models.exchange_stall_s,
                ),
                **extra,
            )
            for node, part in parts.items()
        }
        get_run_logger().info("%s: %s", what, "; ".join(plan_lines(listing, plan)))
        try:
            reports, errors = run_agent_each(transports, models.node_python, jobs, models.timeout_s, board.on_output)
        finally:  # however the stage ends, nothing of the exchange is left serving
            _stop_exchange({n: transports[n] for n in jobs}, checkpoint.path)
    if errors:  # what the nodes that finished met (a peer gone, bad bytes) is part of the news
        met = [f"\n  what {node} met: {event}" for node, report in reports.items() for event in report.events]
        raise K3DeployError(str(failed_on(what, errors)) + "".join(met))
    return {node: report for node, report in reports.items() if plan[node].fetches}


def _exchange_port_taken(transports: Mapping[str, Transport], nodes: list[str], port: int) -> dict[str, str]:
    """Nodes where something already listens on the exchange port: its `ss` line. The exchange would not start
    there, and its peers would send the run's token to whatever does listen."""
    command = shlex.join(nf.listening_cmd())

    def one(node: str, transport: Transport) -> dict[int, str]:
        return nf.listening(transport.run(command, 30).check().stdout)

    listening = on_every_node({n: transports[n] for n in nodes}, one, "looking at the peer exchange's port")
    return {node: ports[port] for node, ports in listening.items() if port in ports}


def _stop_exchange(transports: Mapping[str, Transport], root: str) -> None:
    """Kill any exchange agent still running (after a failure, a timeout); a node that cannot be told is named."""
    stop = stop_command(root)

    def one(node: str, transport: Transport) -> None:
        transport.run(stop, 30).check()

    try:
        on_every_node(transports, one, "stopping the peer exchange")
    except K3DeployError as err:
        get_run_logger().warning("%s: its server may still run until the node's timeout kills it", err)


@task(name="disk space shortfalls", cache_policy=NO_CACHE)
def space_shortfalls(stats: dict[str, Any]) -> list[str]:
    return space_problems(space_needs(stats))


@task(name="check shared storage", cache_policy=NO_CACHE)
def shared_storage_unseen(cfg: DeploymentConfig, ckpt: Checkpoint, outcome: CheckpointOutcome) -> dict[str, str]:
    """With a shared model root, every other node must see node 0's files (same sizes and mtimes)."""
    others = [n.name for n in cfg.cluster.nodes[1:]]
    if not others:
        return {}
    seen = stat_checkpoint.fn(cfg.cluster, cfg.models, ckpt, outcome.listing, others)
    expected = next(iter(outcome.final.values())).fingerprint
    first = cfg.cluster.nodes[0].name
    return {
        node: f"does not see the files {first} verified at {outcome.path} (cluster.model_root_shared is set)"
        for node, report in seen.items()
        if report.fingerprint != expected
    }
