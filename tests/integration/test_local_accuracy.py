"""The accuracy stage on the local profile: the REAL lm_eval and AISBench against the real CPU vLLM, on the local
dataset configs/accuracy/local (ten sums), each to a score with its samples accounted for.

The scripted checkpoint answers every question about the weather: both scores are 0 and lm_eval's
extraction finds no number in any answer; what this shows is the plumbing, the accounting and the record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.flows.validate import validate
from k3deploy.paths import runs_dir
from tests.bedconfig import write_config

pytestmark = [pytest.mark.accuracy, pytest.mark.vllm, pytest.mark.e2e, pytest.mark.prefect,
              pytest.mark.usefixtures("runs_dir"),
              pytest.mark.timeout(1800)]  # fmt: skip  # makes lm_eval's and AISBench's environments on a first run
ROOT = Path(__file__).parents[2]
LOCAL = ROOT / "configs" / "accuracy" / "local"


def test_lm_eval_and_ais_bench_score_the_local_dataset_with_sample_counts(prefect_server, tmp_path):
    data: dict[str, Any] = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    data["accuracy"] = {
        "evaluators": ["lm_eval", "ais_bench"],
        "lm_eval": {"tasks": ["k3_arith"], "include_path": str(LOCAL), "num_concurrent": 2},
        # batch_size sizes AISBench's status queue (5 × batch_size): with 2 it overflowed on a busy machine here,
        # its worker died with queue.Full, and it still exited 0 with a score over 2 of 10 samples ("8 missing").
        "ais_bench": {"dataset_path": str(LOCAL / "k3_arith.jsonl"), "max_out_len": 64, "batch_size": 16},
    }
    config = write_config(tmp_path / "local-accuracy.yaml", data)
    # models too: on a fresh machine nothing else has put the checkpoint in the profile's model root yet.
    state = validate(config=config, only=["models", "launch", "accuracy"], return_state=True)
    assert state.is_completed(), state.message
    document = json.loads((runs_dir() / str(state.state_details.flow_run_id) / "record.json").read_text())
    stage = next(s for s in document["stages"] if s["stage"] == "accuracy")
    assert stage["verdict"] == "pass"
    scores = {s["evaluator"]: s for s in stage["data"]["scores"]}
    lm, ais = scores["lm_eval"], scores["ais_bench"]
    assert (lm["dataset"], lm["version"], lm["metric"], lm["score"]) == (
        "k3_arith",
        "0.4.13",
        "exact_match,first-number",
        0.0,
    )
    # counted against the dataset: completed + failed + missing + unparsed = its 10 lines
    assert (lm["completed"], lm["failed"], lm["missing"], lm["unparsed"], lm["dataset_size"]) == (0, 0, 0, 10, 10)
    assert (ais["dataset"], ais["version"], ais["metric"]) == ("k3_arith", "3.1.20260630", "accuracy")
    assert (ais["completed"] + ais["unparsed"], ais["failed"], ais["missing"], ais["dataset_size"]) == (10, 0, 0, 10)
    assert lm["dataset_hash"].startswith("sha256:") and ais["dataset_hash"].startswith("sha256:")
    folder = Path(stage["data"]["folder"])
    assert list((folder / "lm_eval" / "output").rglob("samples_k3_arith_*.jsonl"))  # raw output kept with the run
    assert list((folder / "ais_bench" / "work").rglob("summary_*.csv"))
