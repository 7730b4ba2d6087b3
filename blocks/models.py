"""Checkpoints: the W4A8 target and the optional DSpark draft."""

from __future__ import annotations

import ipaddress
import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from k3deploy.blocks._types import AbsPath, Arg, RepoId, StrictBlock, Text

DraftKind = Literal["gqa", "mla", "mla-block5"]
GeneratedKind = Literal["scripted", "random"]
# The local hub's rule for a repo id (k3deploy.localhub.store.repo_dir): org/name, nothing that leaves its root.

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

    repo: RepoId = Field(description="Hub repository id, org/name.")
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


class LocalHubConfig(BaseModel):
    """A model hub k3deploy runs on this machine for the models stage, started before it and stopped after."""

    model_config = ConfigDict(extra="forbid")

    root: Arg = Field(
        default="~/.k3deploy/hub",
        validate_default=True,
        description="Folder the hub serves, one org/name folder per repo; ~ is expanded.",
    )
    host: Text = Field(
        default="127.0.0.1",
        description="Loopback IPv4 address the hub listens on: it serves this machine only.",
    )
    port: int = Field(default=18080, ge=1, le=65535, description="Port the hub listens on during the run.")
    generate: dict[RepoId, GeneratedKind] = Field(
        default_factory=dict,
        description="Repo id → scripted or random: tiny Kimi-K3-shaped checkpoints k3deploy generates offline "
        "and publishes on the hub when the hub lacks the repo.",
    )

    @field_validator("root")
    @classmethod
    def _expand_root(cls, value: str) -> str:
        expanded = os.path.expanduser(value)
        if not expanded.startswith("/"):
            raise ValueError(f"must be an absolute path (or start with ~), got {value!r}")
        return expanded

    @field_validator("host")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        try:
            address = ipaddress.IPv4Address(value)
        except ValueError:
            raise ValueError(f"must be a loopback IPv4 address such as 127.0.0.1, got {value!r}") from None
        if not address.is_loopback:
            raise ValueError(
                f"{value} is not a loopback address: the local hub serves this machine only (use 127.0.0.1)"
            )
        return value

    @property
    def url(self) -> str:
        """Where the hub answers, for hub_endpoint and the hub clients."""
        return f"http://{self.host}:{self.port}"


def _same_endpoint(endpoint: str, hub: LocalHubConfig) -> bool:
    """Whether a hub_endpoint URL names the local hub: http, its host and port, no path."""
    try:
        url = urlsplit(endpoint)
        port = url.port or (80 if url.scheme == "http" else None)
    except ValueError:
        return False
    return url.scheme == "http" and url.hostname == hub.host and port == hub.port and url.path in ("", "/")


class ModelsConfig(StrictBlock):
    """Which checkpoints to fetch, from which hub."""

    _block_type_name = "k3deploy models"

    hub: Literal["modelscope", "huggingface"] = Field(default="modelscope", description="Hub to download from.")
    # Before hub_endpoint: that field's validator derives from and checks against it.
    local_hub: LocalHubConfig | None = Field(
        default=None,
        description="A hub on this machine that the models stage starts and stops around its work (local profile).",
    )
    hub_endpoint: Text | None = Field(
        default=None,
        validate_default=True,
        description="Hub URL override (a mirror); None means the public hub, or local_hub's URL when that is set.",
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
    read_timeout_s: float = Field(
        default=60,
        gt=0,
        description="A hub that sends no byte for this long is given up on and the file resumed with Range (seconds).",
    )
    distribution: Literal["stripe", "per-node"] = Field(
        default="stripe",
        description="stripe: each file comes through the hub once, to one node, and the others fetch it from that "
        "node over the cluster network (one copy through the site's uplink); per-node: every node downloads "
        "everything itself. With cluster.model_root_shared there is one copy anyway.",
    )
    exchange_port: int = Field(
        default=18090,
        ge=1,
        le=65535,
        description="Port each node serves its verified files to its peers on, at its cluster address, while the "
        "models stage downloads (stripe); only this run's nodes, holding its one-time token, are served.",
    )
    exchange_slow_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="stripe: a peer sending a file at under this fraction of what the other sources give (the hub's "
        "rate, the other peers' median, per stream) is left mid-file, named, and the rest taken by Range from a "
        "faster peer or, when none holds it, from the hub (once, by one node); 0 never leaves a slow peer.",
    )
    exchange_stall_s: float = Field(
        default=10,
        gt=0,
        le=600,
        description="stripe: a peer that sends no byte of a file for this long is left like a slow one (seconds).",
    )
    download_retries: int = Field(
        default=5,
        ge=0,
        le=100,
        description="Resumes in a row without progress (a stall, a cut, HTTP 408/429/5xx) before a file fails.",
    )

    @field_validator("hub_endpoint")
    @classmethod
    def _local_hub_endpoint(cls, value: str | None, info: ValidationInfo) -> str | None:
        local = info.data.get("local_hub")
        if local is None:
            return value
        if value is None:
            return local.url
        if not _same_endpoint(value, local):
            raise ValueError(
                f"{value} is not where models.local_hub serves ({local.url}); "
                "leave hub_endpoint out to use the local hub, or make the two agree"
            )
        return value
