"""What the engine reports of itself, on the REAL vLLM 0.32.0 (CPU) /metrics and /v1/models of the local profile
(two DP ranks, max_model_len 2048; tests/data/launch/vllm-0.32.0/engine/, docs/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks.launch.engine_report import disagreements, kv_usage_peak, parse_report

DATA = Path(__file__).parents[1] / "data" / "launch" / "vllm-0.32.0"
METRICS = (DATA / "engine" / "metrics-dp2.txt").read_text()
MODELS = (DATA / "engine" / "v1-models.json").read_text()


def test_the_real_report_gives_ranks_context_and_kv_cache_size():
    report = parse_report(METRICS, MODELS, "kimi-k3")
    assert report.engines == ["0", "1"] and report.max_model_len == 2048
    # VLLM_CPU_KVCACHE_SPACE=1 (GiB): 1 GiB of KV cache on each rank, as the engine sized it. Its token figure is
    # the engine's own (kv_cache_size_tokens), not blocks × block size, which vLLM 0.32 reports as twice that.
    assert [(k.block_size, k.blocks, k.tokens, k.bytes) for k in report.kv] == [(128, 16384, 1048576, 1 << 30)] * 2
    assert report.kv_tokens == 1048576
    assert disagreements(report, 2, 2048) == []


def test_a_config_the_engine_did_not_take_is_named_by_key():
    report = parse_report(METRICS, MODELS, "kimi-k3")
    found = dict(disagreements(report, 4, 4096))
    assert found["serve.data_parallel_size"] == "4 asked; /metrics reports engine(s) 0, 1"
    assert found["serve.max_model_len"] == "4096 asked; /v1/models says 2048"


def test_a_rank_missing_from_metrics_is_a_disagreement():
    one = "\n".join(line for line in METRICS.splitlines() if 'engine="1"' not in line)
    assert disagreements(parse_report(one, MODELS, "kimi-k3"), 2, 2048) == [
        ("serve.data_parallel_size", "2 asked; /metrics reports engine(s) 0")
    ]


@pytest.mark.parametrize("models", ["", "{}", '{"data": []}', MODELS.replace('"kimi-k3"', '"other"')])
def test_a_models_list_without_the_served_model_is_unreadable(models):
    with pytest.raises(UnreadableEvidence, match="/v1/models does not list 'kimi-k3'"):
        parse_report(METRICS, models, "kimi-k3")


def test_kv_usage_is_the_fullest_rank_of_a_real_reading_while_requests_run():
    running = (DATA / "metrics" / "running-1.txt").read_text()
    assert kv_usage_peak(running) == pytest.approx(0.0015871078012452688)
    assert kv_usage_peak((DATA / "metrics" / "idle.txt").read_text()) == 0.0
    assert kv_usage_peak("") is None
    assert (
        kv_usage_peak(running.replace("0.0015871078012452688", "NaN").replace("0.0003662556464412159", "NaN")) is None
    )
