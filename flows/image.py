"""The image stage: pull by digest or build, the same image id on every node, what is inside it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.image.agreement import image_problems
from k3deploy.tasks.image.engine import split_ref
from k3deploy.tasks.image.steps import ImageRecord, build_image, probe_image, pull_image
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from k3deploy.errors import K3DeployError

DEFAULT_CONFIG = "configs/local.yaml"


class ImageStageFailed(K3DeployError):
    """The nodes do not all hold one image, or it lacks what Kimi-K3 needs."""


@task(name="publish image artifacts", cache_policy=NO_CACHE)
def publish_artifacts(record: ImageRecord, problems: list[str]) -> None:
    create_table_artifact(
        [{"node": node, "image id": image_id} for node, image_id in record.nodes.items()],
        key="image-nodes",
        description=f"`{record.ref}` digest `{record.digest}`",
    )
    create_table_artifact(
        [{"check": f.check, "verdict": "ok" if f.ok else "FAIL", "detail": f.detail} for f in record.findings],
        key="image-checks",
    )
    lines = [
        f"# Image: {'PASS' if not problems else 'FAIL'}",
        "",
        f"- ref `{record.ref}`, image id `{record.image_id}`, digest `{record.digest}`",
        f"- source revision `{record.source_revision}`, VLLM_COMMIT `{record.vllm_commit}`",
        *[f"- {name} {version}" for name, version in record.versions.items()],
        *([""] + ["## Problems"] + [f"- {p}" for p in problems] if problems else []),
    ]
    create_markdown_artifact("\n".join(lines) + "\n", key="image-summary", description="image stage verdict")


@flow(name="image")
def image(config: str = DEFAULT_CONFIG) -> dict[str, Any]:
    """Every node holds the same image, pinned or built from a known revision, with vLLM-Ascend's Kimi-K3 support."""
    cfg = load_config(config)
    record = ImageRecord(ref=cfg.image.pinned_ref)
    if cfg.image.build is not None:
        held, record.source_revision, record.vllm_commit, record.digest = build_image(cfg.cluster, cfg.image)
    else:
        held = pull_image(cfg.cluster, cfg.image)
        repository = split_ref(record.ref)[0]
        record.digest = cfg.image.digest or next(iter(held.values())).digest_of(repository)
    record.nodes = {node: image.id for node, image in held.items()}
    problems = image_problems(held, cfg.image.digest if cfg.image.build is None else None)
    if not problems:
        record.image_id = next(iter(held.values())).id
        record.versions, record.findings = probe_image(cfg.cluster, record.image_id)
        problems = [f"{f.check}: {f.detail}" for f in record.findings if not f.ok]
    publish_artifacts(record, problems)
    if problems:
        raise ImageStageFailed("image stage failed:\n  " + "\n  ".join(problems))
    return asdict(record) | {"verdict": "pass"}
