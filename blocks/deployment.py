"""The whole deployment: one document, five blocks, checked as a unit."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field, SecretStr, model_validator

from k3deploy.blocks._types import StrictBlock
from k3deploy.blocks.accuracy import AccuracyConfig
from k3deploy.blocks.alerts import AlertsConfig
from k3deploy.blocks.bench import BenchConfig
from k3deploy.blocks.capacity import CapacityConfig
from k3deploy.blocks.checks import config_problems
from k3deploy.blocks.cluster import ClusterConfig
from k3deploy.blocks.conformance import ConformanceConfig
from k3deploy.blocks.fleet import ServerConfig, StoreConfig
from k3deploy.blocks.image import ImageConfig
from k3deploy.blocks.models import KNOWN_DRAFTS, SPECULATIVE_TOKENS, ModelsConfig
from k3deploy.blocks.serve import ServeConfig
from k3deploy.blocks.smoke import SmokeConfig
from k3deploy.blocks.soak import SoakConfig
from k3deploy.core.errors import ConfigError

# Settings that do not change what runs on the nodes: left out of the servers' fingerprint.
NOT_SERVING: dict[str, Any] = {
    "smoke": True,
    "conformance": True,
    "bench": True,
    "capacity": True,
    "soak": True,
    "accuracy": True,
    "alerts": True,
    "server": True,
    "store": True,
    "serve": {"readiness", "liveness"},
    "cluster": {"name", "on_busy", "busy_timeout_s", "hold_beat_s", "ssh"},
    "models": {"threads", "timeout_s", "read_timeout_s", "download_retries", "node_python"},
}


class DeploymentConfig(StrictBlock):
    """A Kimi-K3 deployment: cluster, checkpoints, image, server and benchmark."""

    _block_type_name = "k3deploy deployment"

    cluster: ClusterConfig = Field(description="Nodes and how to reach them.")
    models: ModelsConfig = Field(default_factory=ModelsConfig, description="Target and draft checkpoints.")
    image: ImageConfig = Field(default_factory=ImageConfig, description="Image to pull or build.")
    serve: ServeConfig = Field(default_factory=ServeConfig, description="vllm serve flags and environment.")
    smoke: SmokeConfig = Field(default_factory=SmokeConfig, description="Smoke checks against the service.")
    conformance: ConformanceConfig = Field(
        default_factory=ConformanceConfig, description="The served API against the Kimi-K3 contract."
    )
    bench: BenchConfig = Field(default_factory=BenchConfig, description="vllm bench serve parameters.")
    capacity: CapacityConfig = Field(
        default_factory=CapacityConfig, description="The highest concurrency that holds the SLOs, found by search."
    )
    soak: SoakConfig = Field(default_factory=SoakConfig, description="Steady load for hours, judged for drift.")
    accuracy: AccuracyConfig = Field(default_factory=AccuracyConfig, description="Accuracy evaluators.")
    alerts: AlertsConfig = Field(default_factory=AlertsConfig, description="Who hears of a failed or REGRESSED run.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="A run without its Prefect server.")
    store: StoreConfig = Field(default_factory=StoreConfig, description="A run without the fleet's shared store.")

    @model_validator(mode="after")
    def _derive_and_check(self) -> DeploymentConfig:
        # ConfigError is not a ValueError, so pydantic lets it through with every problem listed.
        self._fill_defaults()
        problems = config_problems(self)
        if problems:
            raise ConfigError(problems)
        return self

    def _fill_defaults(self) -> None:
        root = self.cluster.model_root.rstrip("/")
        target = self.models.target
        if target.path is None:
            target.path = f"{root}/{target.repo.rsplit('/', 1)[-1]}"
        if self.models.tokenizer_path is None:
            self.models.tokenizer_path = target.path
        draft = self.models.draft
        if draft is not None:
            if draft.path is None:
                draft.path = f"{root}/{draft.repo.rsplit('/', 1)[-1]}"
            kind = draft.kind or KNOWN_DRAFTS.get(draft.repo)
            if kind is not None:
                draft.kind = kind
                if draft.num_speculative_tokens is None:
                    draft.num_speculative_tokens = SPECULATIVE_TOKENS[kind]
            if draft.draft_tensor_parallel_size is None:
                draft.draft_tensor_parallel_size = self.serve.tensor_parallel_size

    def fingerprint(self) -> str:
        """Short hash of what shapes the servers (nodes, checkpoints, image, serve flags; no secret): it labels
        them, so a rerun, a later stage or teardown recognises them whatever the smoke, bench, accuracy,
        readiness, liveness or scheduling settings of its config say."""
        data = self.model_dump(mode="json", exclude=NOT_SERVING)
        blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def evidence_key(self) -> str:
        """Names the folder of a measuring stage's saved outputs (bench, accuracy): what was measured under
        this very config is reused on a Retry; any other (a Retry after an edit, a bisect's next experiment)
        measures afresh."""
        blob = json.dumps(self.public(), sort_keys=True, default=str).encode()
        return f"{self.fingerprint()}-{hashlib.sha256(blob).hexdigest()[:8]}"

    def public(self) -> dict[str, Any]:
        """The config as JSON with every secret set to null (not masked: a mask still says a secret exists)."""

        def clean(value: Any) -> Any:
            if isinstance(value, SecretStr):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items() if k != "block_type_slug"}
            if isinstance(value, list):
                return [clean(v) for v in value]
            return value

        return json.loads(json.dumps(clean(self.model_dump(mode="python")), default=str))
