"""The CPU vLLM environment the vllm tests use: the local profile's (K3DEPLOY_VLLM_ENV overrides it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

PROFILE = yaml.safe_load((Path(__file__).parents[1] / "configs" / "local.yaml").read_text())
VLLM_ENV = Path(os.environ.get("K3DEPLOY_VLLM_ENV", PROFILE["image"]["environment"]["path"]))
VLLM = VLLM_ENV / "bin" / "vllm"
# Never skipped in CI, which provisions it (.ci/run): there a missing environment fails.
needs_vllm_env = pytest.mark.skipif(
    not os.access(VLLM, os.X_OK) and not os.environ.get("CI"),
    reason=f"no CPU vLLM environment at {VLLM_ENV} (set K3DEPLOY_VLLM_ENV)",
)
