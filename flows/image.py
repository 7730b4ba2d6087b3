"""The image stage: pull by digest or build, the same image id on every node, what is inside it."""

from dataclasses import asdict

from prefect import flow

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import ImageStageFailed
from k3deploy.core.stage import StageResult
from k3deploy.tasks.image.establish import establish_image
from k3deploy.tasks.stage_run import StageRun


@flow(name="image", persist_result=True)
def image(config: ConfigSource) -> StageResult:
    """Every node holds the same image, pinned or built from a known revision, with vLLM-Ascend's Kimi-K3 support."""
    cfg = resolve_config(config)
    run = StageRun("image", ImageStageFailed)
    with run.guard():
        record = establish_image(cfg)
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
