"""The image stage: pull by digest or build, the same image id on every node, what is inside it."""

from dataclasses import asdict

from prefect import flow

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.errors import ImageStageFailed
from k3deploy.stage import StageResult
from k3deploy.tasks.image.agreement import image_problems
from k3deploy.tasks.image.engine import split_ref
from k3deploy.tasks.image.steps import (
    ImageRecord,
    build_image,
    probe_environment,
    probe_image,
    provision_environment,
    pull_image,
)
from k3deploy.tasks.stage_run import StageRun


@flow(name="image", persist_result=True)
def image(config: ConfigSource) -> StageResult:
    """Every node holds the same image, pinned or built from a known revision, with vLLM-Ascend's Kimi-K3 support."""
    cfg = resolve_config(config)
    run = StageRun("image", ImageStageFailed)
    with run.guard():
        record = _environment(cfg) if cfg.serve.runtime == "process" else _image(cfg)
    run.findings = list(record.findings)
    run.table(
        "nodes", [{"node": n, "image id": i} for n, i in record.nodes.items()], f"`{record.ref}` `{record.digest}`"
    )
    run.table("checks", [{"check": f.check, "ok": f.ok, "detail": f.detail} for f in record.findings])
    run.note(f"ref `{record.ref}`, image id `{record.image_id}`, digest `{record.digest}`")
    run.note(f"source revision `{record.source_revision}`, VLLM_COMMIT `{record.vllm_commit}`")
    for name, version in record.versions.items():
        run.note(f"{name} {version}")
    run.data = asdict(record)
    if any(not f.ok for f in run.findings):
        run.failed("the nodes do not all hold one image with what Kimi-K3 needs")
    versions = ", ".join(f"{n} {v}" for n, v in record.versions.items())
    return run.passed(f"{record.image_id[:19]} on {len(record.nodes)} nodes; {versions}")


def _image(cfg: DeploymentConfig) -> ImageRecord:
    """The container runtime's image: pulled or built, one image id on every node, then what is inside it."""
    record = ImageRecord(ref=cfg.image.pinned_ref)
    if cfg.image.build is not None:
        held, record.source_revision, record.vllm_commit, record.digest = build_image(cfg.cluster, cfg.image)
    else:
        held = pull_image(cfg.cluster, cfg.image)
        record.digest = cfg.image.digest or next(iter(held.values())).digest_of(split_ref(record.ref)[0])
    record.nodes = {node: held_image.id for node, held_image in held.items()}
    record.findings = image_problems(held, cfg.image.digest if cfg.image.build is None else None)
    if not record.findings:
        record.image_id = next(iter(held.values())).id
        record.versions, record.findings = probe_image(cfg.cluster, record.image_id, cfg.serve.container)
    return record


def _environment(cfg: DeploymentConfig) -> ImageRecord:
    """The process runtime's environment: made or reused on every node, the same everywhere, then what is inside."""
    record = provision_environment(cfg.cluster, cfg.image)
    if all(f.ok for f in record.findings):
        record.versions, found = probe_environment(cfg.cluster, cfg.image, record.image_id)
        record.findings += found
    return record
