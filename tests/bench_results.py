"""Editing a real `vllm bench serve` result for a test: a change of counts or duration with every rate made its
count over the duration again, as the tool computes them, so the edit agrees with itself and a test sees only the
rule it is about (tasks/bench/consistency.py refuses rates that do not)."""

from __future__ import annotations

from typing import Any


def recounted(data: dict[str, Any]) -> dict[str, Any]:
    duration = data["duration"]
    data["request_throughput"] = data["completed"] / duration
    data["output_throughput"] = data["total_output_tokens"] / duration
    data["total_token_throughput"] = (data["total_input_tokens"] + data["total_output_tokens"]) / duration
    return data
