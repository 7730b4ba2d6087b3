"""vLLM's `/metrics` (Prometheus text format): samples, and counters summed per DP engine.

Counters end in `_total`; vLLM labels each with `engine` (the DP rank) and `model_name`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Every sample line (comments and blank lines skipped; a line that is not a sample is skipped too)."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if line.startswith("#") or match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        samples.append(Sample(match.group(1), dict(_LABEL.findall(match.group(2) or "")), value))
    return samples


def per_engine(samples: list[Sample], name: str) -> dict[str, float]:
    """Metric `name` summed over its other labels, per `engine` label ('' where a sample has none)."""
    out: dict[str, float] = {}
    for sample in samples:
        if sample.name == name:
            engine = sample.labels.get("engine", "")
            out[engine] = out.get(engine, 0.0) + sample.value
    return out


def total(samples: list[Sample], name: str) -> float | None:
    """Metric `name` summed over every label; None when vLLM does not report it."""
    values = [s.value for s in samples if s.name == name]
    return sum(values) if values else None


def change(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per-key increase of a counter between two readings (keys of either)."""
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(before) | set(after))}
