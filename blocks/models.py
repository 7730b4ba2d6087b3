"""Checkpoints: the W4A8 target and the optional DSpark draft."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from k3deploy.blocks._types import AbsPath, StrictBlock, Text

DraftKind = Literal["gqa", "mla", "mla-block5"]

# Seed section 3.1: the published drafts, their architecture and speculative-token count.
KNOWN_DRAFTS: dict[str, DraftKind] = {
    "RadixArk/Kimi-K3-DSpark": "gqa",
    "Inferact/Kimi-K3-DSpark": "mla",
    "Inferact/Kimi-K3-DSpark-Block5": "mla-block5",
}
SPECULATIVE_TOKENS: dict[DraftKind, int] = {"gqa": 7, "mla": 7, "mla-block5": 5}


class CheckpointSpec(BaseModel):
    """A hub repository pinned to a revision and the path it lives at on every node."""

    model_config = ConfigDict(extra="forbid")

    repo: Text = Field(description="Hub repository id, org/name.")
    revision: Text | None = Field(
        default=None, description="Branch, tag or commit; None means the hub's default branch."
    )
    path: AbsPath | None = Field(
        default=None, description="Where it lives on every node; defaults to model_root/<name>."
    )


class DraftSpec(CheckpointSpec):
    """A DSpark draft and the speculative config it is served with (seed section 5.2)."""

    kind: DraftKind | None = Field(
        default=None,
        description="gqa, mla or mla-block5; known from the repo for the published drafts.",
    )
    method: Text = Field(default="dspark", description="speculative_config.method")
    num_speculative_tokens: int | None = Field(
        default=None, ge=1, description="7 for the GQA and MLA drafts, 5 for Block5; derived from kind."
    )
    draft_tensor_parallel_size: int | None = Field(
        default=None, ge=1, description="Draft TP; defaults to the target's tensor-parallel size."
    )
    max_model_len: int = Field(default=4096, ge=1, description="Draft max_model_len; not above the target's.")
    draft_sample_method: Text = Field(default="greedy", description="speculative_config.draft_sample_method")
    enforce_eager: bool = Field(default=True, description="speculative_config.enforce_eager")


class ModelsConfig(StrictBlock):
    """Which checkpoints to fetch, from which hub."""

    _block_type_name = "k3deploy models"

    hub: Literal["modelscope", "huggingface"] = Field(default="modelscope", description="Hub to download from.")
    hub_endpoint: Text | None = Field(
        default=None, description="Hub URL override (a mirror); None means the public hub."
    )
    hub_token: SecretStr | None = Field(default=None, description="Hub access token; or set K3DEPLOY_HUB_TOKEN.")
    target: CheckpointSpec = Field(
        default_factory=lambda: CheckpointSpec(repo="Eco-Tech/Kimi-K3-w4a8"),
        description="The served checkpoint.",
    )
    tokenizer_path: AbsPath | None = Field(default=None, description="TOKENIZER_PATH; defaults to the target's path.")
    draft: DraftSpec | None = Field(default=None, description="Optional DSpark draft; None serves without.")
    node_python: Text = Field(
        default="python3",
        description="Python 3.9+ on every node; runs k3deploy's standard-library downloader and hasher there.",
    )
    threads: int = Field(default=4, ge=1, le=64, description="Files hashed or downloaded at once on each node.")
    timeout_s: float = Field(
        default=172800, gt=0, description="Longest a download or a verification may run on one node (seconds)."
    )
