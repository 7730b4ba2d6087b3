"""What the engine says of itself once ready, against what the config asked (no I/O).

From node 0's `/metrics`: the DP ranks that report (`vllm:cache_config_info` carries one sample per engine,
written when the engine starts) and each engine's KV cache (`block_size`, `num_gpu_blocks`,
`kv_cache_size_tokens`, `kv_cache_memory_bytes` labels); from `/v1/models`: the served model's
`max_model_len`. Formats as the real vLLM 0.32.0 writes them (tests/data/launch/vllm-0.32.0/engine/).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks import metrics

CACHE_INFO = "vllm:cache_config_info"
KV_USAGE = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True)
class EngineKv:
    engine: str
    block_size: int | None
    blocks: int | None
    tokens: int | None  # KV-cache capacity in tokens, as the engine sized it at start
    bytes: int | None


@dataclass(frozen=True)
class EngineReport:
    engines: list[str]  # the DP ranks that report, in rank order
    max_model_len: int | None
    kv: list[EngineKv] = field(default_factory=list)

    @property
    def kv_tokens(self) -> int | None:
        """The smallest rank's KV-cache capacity in tokens: what a request routed anywhere can count on."""
        sizes = [k.tokens for k in self.kv if k.tokens is not None]
        return min(sizes) if sizes else None

    def as_data(self) -> dict[str, Any]:
        return asdict(self) | {"kv_tokens": self.kv_tokens}


def _int(labels: dict[str, str], key: str) -> int | None:
    value = labels.get(key, "None")
    try:
        return int(float(value))
    except ValueError:
        return None


def parse_report(metrics_text: str, models_text: str, served_name: str) -> EngineReport:
    """The engine's own figures; UnreadableEvidence when /v1/models does not list the served model."""
    kv = [
        EngineKv(s.labels.get("engine", ""), _int(s.labels, "block_size"), _int(s.labels, "num_gpu_blocks"),
                 _int(s.labels, "kv_cache_size_tokens"), _int(s.labels, "kv_cache_memory_bytes"))
        for s in metrics.parse(metrics_text) if s.name == CACHE_INFO
    ]  # fmt: skip
    kv.sort(key=lambda k: (len(k.engine), k.engine))
    try:
        listed = json.loads(models_text)["data"]
        card = next(m for m in listed if isinstance(m, dict) and m.get("id") == served_name)
    except (ValueError, KeyError, TypeError, StopIteration):
        raise UnreadableEvidence(f"/v1/models does not list {served_name!r}: {models_text[:200]!r}") from None
    length = card.get("max_model_len")
    return EngineReport([k.engine for k in kv], length if isinstance(length, int) else None, kv)


def disagreements(report: EngineReport, dp_size: int, max_model_len: int) -> list[tuple[str, str]]:
    """(config key, what the engine says instead) for every figure the engine reports otherwise."""
    out: list[tuple[str, str]] = []
    expected = [str(rank) for rank in range(dp_size)]
    if report.engines != expected:
        said = ", ".join(report.engines) or "none"
        out.append(("serve.data_parallel_size", f"{dp_size} asked; /metrics reports engine(s) {said}"))
    if report.max_model_len != max_model_len:
        out.append(("serve.max_model_len", f"{max_model_len} asked; /v1/models says {report.max_model_len}"))
    return out


def kv_usage_peak(metrics_text: str) -> float | None:
    """The fullest rank's KV-cache usage (0-1) in one /metrics reading; None when vLLM does not report it."""
    values = [s.value for s in metrics.parse(metrics_text) if s.name == KV_USAGE and 0 <= s.value <= 1]
    return max(values) if values else None
