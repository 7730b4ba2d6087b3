"""The image stage's sequence: pull or build, agree on one image id, then probe what is inside.

The container runtime holds an image; the process runtime an environment made on every node. Either
way the stage ends with one ImageRecord whose findings say what is wrong and where.
"""

from __future__ import annotations

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.stage import Finding
from k3deploy.tasks.image.agreement import image_problems
from k3deploy.tasks.image.engine import split_ref
from k3deploy.tasks.image.probe import Choices, name_findings
from k3deploy.tasks.image.steps import (
    ImageRecord,
    build_image,
    probe_environment,
    probe_image,
    provision_environment,
    pull_image,
)


def establish_image(cfg: DeploymentConfig) -> ImageRecord:
    return _environment(cfg) if cfg.serve.runtime == "process" else _image(cfg)


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
        record.versions, choices, record.findings = probe_image(cfg.cluster, record.image_id, cfg.serve.container)
        record.findings += _names(cfg, choices) if choices else []
    return record


def _environment(cfg: DeploymentConfig) -> ImageRecord:
    """The process runtime's environment: made or reused on every node, the same everywhere, then what is inside."""
    record = provision_environment(cfg.cluster, cfg.image)
    if all(f.ok for f in record.findings):
        record.versions, choices, found = probe_environment(cfg.cluster, cfg.image, record.image_id)
        record.findings += found + (_names(cfg, choices) if choices else [])
    return record


def _names(cfg: DeploymentConfig, choices: Choices) -> list[Finding]:
    """This config's tokenizer mode and parsers against the names the image's vLLM knows."""
    serve = cfg.serve
    wanted = {"--tokenizer-mode": serve.tokenizer_mode, "--tool-call-parser": serve.tool_call_parser,
              "--reasoning-parser": serve.reasoning_parser}  # fmt: skip
    return name_findings(choices, wanted, [str(a) for a in serve.extra_args])
