"""The models stage: list, look, verify, make room, download what is missing or bad, agree, check contents."""

from __future__ import annotations

from typing import Any

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.loader import load_config
from k3deploy.tasks.models.checks import space_problems
from k3deploy.tasks.models.outcome import (
    CheckpointOutcome,
    ModelsOutcome,
    content_findings,
    files_to_fetch,
    space_needs,
)
from k3deploy.tasks.models.steps import (
    Checkpoint,
    checkpoints,
    fetch_checkpoint,
    list_checkpoint,
    stat_checkpoint,
    storage_nodes,
    verify_checkpoint,
)
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from k3deploy.errors import K3DeployError

DEFAULT_CONFIG = "configs/local.yaml"


class ModelsStageFailed(K3DeployError):
    """A checkpoint is missing, corrupt, different across nodes, or does not fit the deployment."""


@task(name="refuse if the disk is short", cache_policy=NO_CACHE)
def refuse_if_short(stats: dict[str, Any]) -> None:
    problems = space_problems(space_needs(stats))
    if problems:
        raise ModelsStageFailed("not downloading, the model root is too small:\n  " + "\n  ".join(problems))


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


@task(name="publish models artifacts", cache_policy=NO_CACHE)
def publish_artifacts(outcome: ModelsOutcome) -> None:
    for c in outcome.checkpoints:
        create_table_artifact(
            c.manifest_rows(),
            key=f"models-manifest-{c.role}",
            description=f"{c.role} `{c.listing.repo}` commit `{c.listing.commit}`, {c.listing.total_bytes} bytes",
        )
    create_table_artifact([r for c in outcome.checkpoints for r in c.node_rows()], key="models-nodes")
    create_markdown_artifact(outcome.markdown(), key="models-summary", description="models stage verdict")


@flow(name="models")
def models(config: str = DEFAULT_CONFIG, download: bool = True) -> dict[str, Any]:
    """Every node holds the configured checkpoints at the hub's commit, verified; else fail naming node and file."""
    cfg = load_config(config)
    nodes = storage_nodes(cfg.cluster)
    wanted = checkpoints(cfg.models)
    listings = {c.role: list_checkpoint(cfg.models, c) for c in wanted}
    stats = {c.role: stat_checkpoint(cfg.cluster, cfg.models, c, listings[c.role], nodes) for c in wanted}
    outcomes = {
        c.role: CheckpointOutcome(
            c.role,
            c.path,
            listings[c.role],
            verify_checkpoint(cfg.cluster, cfg.models, c, listings[c.role], stats[c.role]),
        )
        for c in wanted
    }
    to_fetch = {role: files_to_fetch(o.verified) for role, o in outcomes.items()}
    if download and any(paths for per_node in to_fetch.values() for paths in per_node.values()):
        refuse_if_short(stats)
        for c in wanted:
            if any(to_fetch[c.role].values()):
                outcomes[c.role].fetched = fetch_checkpoint(
                    cfg.cluster, cfg.models, c, listings[c.role], to_fetch[c.role]
                )
    if cfg.cluster.model_root_shared:
        for c in wanted:
            outcomes[c.role].unseen = shared_storage_unseen(cfg, c, outcomes[c.role])
    found = content_findings(outcomes, cfg.models.draft, quantized=cfg.serve.quantization is not None)
    outcome = ModelsOutcome(list(outcomes.values()), found)
    publish_artifacts(outcome)
    if not outcome.ok:
        raise ModelsStageFailed("models stage failed:\n  " + "\n  ".join(outcome.problems()))
    return outcome.record()
