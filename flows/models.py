"""The models stage: list, look, verify, make room, download what is missing or bad, agree, check contents.

With models.local_hub set, the local hub is started for the stage and stopped after it.
"""

from prefect import flow

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import ModelsStageFailed
from k3deploy.core.stage import Finding, StageResult
from k3deploy.tasks.models.localhub import local_hub
from k3deploy.tasks.models.outcome import CheckpointOutcome, ModelsOutcome, content_findings, files_to_fetch
from k3deploy.tasks.models.steps import (
    checkpoints,
    fetch_checkpoint,
    list_checkpoint,
    shared_storage_unseen,
    space_shortfalls,
    stat_checkpoint,
    storage_nodes,
    verify_checkpoint,
)
from k3deploy.tasks.stage_run import StageRun


@flow(name="models", persist_result=True)
def models(config: ConfigSource, download: bool = True, full_verify: bool = False) -> StageResult:
    """Every node holds the configured checkpoints at the hub's commit, verified; else fail naming node and file.

    full_verify hashes every file on every node whatever the manifests and the cache say: the quick check
    trusts a file whose size and mtime are unchanged since it was verified.
    """
    cfg = resolve_config(config)
    run = StageRun("models", ModelsStageFailed)
    with run.guard(), local_hub(cfg.models):  # the local profile's hub, serving only while the stage works
        outcome = _verify_and_fetch(cfg, run, download, full_verify)
    for c in outcome.checkpoints:
        description = f"{c.role} `{c.listing.repo}` commit `{c.listing.commit}`, {c.listing.total_bytes} bytes"
        run.table(f"manifest-{c.role}", c.manifest_rows(), description)
    rows = [r for c in outcome.checkpoints for r in c.node_rows()]
    for row in rows:  # a table cell is text
        row["from each peer bytes"] = ", ".join(f"{p} {n}" for p, n in row["from each peer bytes"].items()) or "-"
    run.table("nodes", rows)
    run.table("checks", [vars(f) for f in outcome.findings])
    for line in outcome.summary_lines():
        run.note(line)
    for c in outcome.checkpoints:
        for event in c.events():
            run.note(f"{c.role} exchange, {event}")
    repaired = [row | {"checkpoint": c.role} for c in outcome.checkpoints for row in c.repaired()]
    run.table("repaired", repaired, "files found bad on a node (not missing) and downloaded again: check that disk")
    for row in repaired:
        run.note(f"**{row['node']}** had a bad `{row['file']}` ({row['found']}): downloaded again")
    run.findings = outcome.problem_findings()
    run.data = outcome.record()
    return run.passed(", ".join(c.headline() for c in outcome.checkpoints))


def _verify_and_fetch(cfg: DeploymentConfig, run: StageRun, download: bool, full: bool) -> ModelsOutcome:
    nodes = storage_nodes(cfg.cluster)
    wanted = checkpoints(cfg.models)
    listings = {c.role: list_checkpoint(cfg.models, c) for c in wanted}
    stats = {c.role: stat_checkpoint(cfg.cluster, cfg.models, c, listings[c.role], nodes) for c in wanted}
    verify = verify_checkpoint.with_options(refresh_cache=True) if full else verify_checkpoint
    outcomes = {}
    for c in wanted:
        # return_state: a cache hit is the earlier run's verification, and the record must say so.
        state = verify(cfg.cluster, cfg.models, c, listings[c.role], stats[c.role], full, return_state=True)
        outcomes[c.role] = CheckpointOutcome(
            c.role, c.path, listings[c.role], state.result(), reused=state.name == "Cached"
        )
    to_fetch = {role: files_to_fetch(o.verified) for role, o in outcomes.items()}
    if download and any(paths for per_node in to_fetch.values() for paths in per_node.values()):
        short = space_shortfalls(stats)
        if short:
            run.findings = [Finding(line.split(":", 1)[0], "free space", False, line) for line in short]
            run.failed("not downloading, the model root is too small")
        for c in wanted:
            if any(to_fetch[c.role].values()):
                outcomes[c.role].fetched = fetch_checkpoint(
                    cfg.cluster, cfg.models, c, listings[c.role], to_fetch[c.role]
                )
    if cfg.cluster.model_root_shared:
        for c in wanted:
            outcomes[c.role].unseen = shared_storage_unseen(cfg, c, outcomes[c.role])
    found = content_findings(outcomes, cfg.models.draft, cfg.serve)
    return ModelsOutcome(list(outcomes.values()), found)
