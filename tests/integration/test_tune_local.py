"""`k3deploy tune` on the local profile (real CPU vLLM), as a person runs it: a matrix of four cells — two
`max_num_seqs`, one the engine rejects, one with ngram speculative decoding — interrupted (SIGKILL) during the
second cell's launch and resumed; the report's frontier drawn by a real headless Chromium.

The profile is narrowed to one node and DP rank so a cell (launch, smoke, bench, teardown) takes well under a
minute here; a second rank changes nothing the tune does.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

from k3deploy.blocks.loader import load_config
from k3deploy.records.tune_report import DOMINATED_COLOUR, FRONTIER_COLOUR, REFERENCE_COLOUR
from tests.ports import port_free

pytestmark = [pytest.mark.bench, pytest.mark.launch, pytest.mark.cli, pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.prefect, pytest.mark.timeout(1500)]  # fmt: skip
ROOT = Path(__file__).parents[2]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
MATRIX = {
    "axes": {"serve.max_num_seqs": [2, 4]},
    "cells": [
        # vLLM refuses it at start-up: max_num_batched_tokens (2048) must be ≥ max_num_seqs
        {"name": "rejected", "set": {"serve.max_num_seqs": 4096}},
        {"name": "ngram", "set": {"serve.speculative_config": NGRAM}},
    ],
    "workloads": "cold only (random)",
    "concurrency": [2],
    # ngram drafts from n-grams already in the sequence: the scripted model's greedy babble walks into a cycle
    # within ~20 tokens. Greedy must be asked for: `vllm bench serve` (0.32) samples at the server's
    # temperature unless told, and sampled babble almost never repeats (a clean-clone CI run drew 0 of 153).
    # Ten prompts: a cell's figures, its acceptance and the frontier need no more (each cell's bench halves).
    "bench": {"random_output_len": 64, "num_prompts": 10, "extra_args": ["--temperature", "0"]},
}
CELLS = ["max_num_seqs=2", "max_num_seqs=4", "rejected", "ngram"]


@pytest.fixture(scope="module")
def bed(prefect_server, tmp_path_factory) -> Iterator[dict[str, Any]]:
    from prefect.settings import PREFECT_API_URL

    folder = tmp_path_factory.mktemp("tune")
    data = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:1]
    data["serve"]["data_parallel_size"] = 1
    data["serve"]["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one rank: its model in the engine's process
    data["serve"]["liveness"] = {"metrics_poll_s": 0.5}  # the KV cache's fullest point, read often in a short bench
    (folder / "local.yaml").write_text(yaml.safe_dump(data))
    (folder / "tune.yaml").write_text(yaml.safe_dump(MATRIX))
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "COLUMNS": "200",
           "K3DEPLOY_RUNS_DIR": str(folder / "runs"), "K3DEPLOY_HOME": str(folder / "home")}  # fmt: skip
    state = Path(load_config(folder / "local.yaml").serve.process.state_dir)
    bed = {"folder": folder, "config": str(folder / "local.yaml"), "matrix": str(folder / "tune.yaml"), "env": env,
           "state": state}  # fmt: skip
    yield bed
    # A failed test still leaves nothing serving on the local profile's port for the tests after it.
    k3deploy(bed, "teardown", "-c", bed["config"])


def k3deploy(bed: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "k3deploy", *args]
    return subprocess.run(command, capture_output=True, text=True, env=bed["env"], timeout=1200, cwd=ROOT)


def interrupted_tune(bed: dict[str, Any]) -> str:
    """The tune killed (SIGKILL, its whole process group) once the second cell's server has started."""
    command = [sys.executable, "-m", "k3deploy", "tune", "-c", bed["config"], "--matrix", bed["matrix"]]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=bed["env"],
                            cwd=ROOT, start_new_session=True)  # fmt: skip
    assert proc.stderr is not None
    pid = bed["state"] / "vllm-kimi-k3-local0" / "pid"
    seen, second, deadline = [], False, time.monotonic() + 900
    selector = selectors.DefaultSelector()
    selector.register(proc.stderr, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if second and pid.exists():
                break
            if selector.select(timeout=0.5):
                line = proc.stderr.readline()
                assert line, "the tune ended before its second cell: " + "".join(seen[-30:])
                seen.append(line)
                second = second or "▶▶ cell max_num_seqs=4" in line
        else:
            pytest.fail("the second cell's server did not start within 900 s: " + "".join(seen[-30:]))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    runs = bed["folder"] / "runs"
    (record,) = runs.glob("*/tune.json")
    document = json.loads(record.read_text())
    assert [c["name"] for c in document["cells"]] == ["max_num_seqs=2"] and document["ended_at"] is None
    return document["tune_id"]


def launches(flow_run_id: str) -> list[dict[str, Any]]:
    """The serve settings of every launch subflow the tune's flow run started, in order."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
        )
        named = [(r, client.read_flow(r.flow_id).name) for r in sorted(runs, key=lambda r: r.created)]
    return [r.parameters["config"]["serve"] for r, name in named if name == "launch"]


def test_a_matrix_interrupted_mid_cell_resumes_records_a_rejected_cell_and_draws_its_frontier(bed):
    first = interrupted_tune(bed)
    # The killed run's hold on the cluster is released by hand (its holder is known dead); nothing else is done:
    # the second cell's server it left starting is adopted by the resumed tune, not started twice.
    released = k3deploy(bed, "cluster", "release", "-c", bed["config"], "--force")
    assert released.returncode == 0 and "released cluster" in released.stdout, released.stdout + released.stderr
    out = k3deploy(bed, "tune", "-c", bed["config"], "--matrix", bed["matrix"], "--resume", first[:8])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("tune record: ")]
    document = json.loads(Path(line.removeprefix("tune record: ")).read_text())
    assert document["resumed_from"] == first and document["ended_at"] is not None
    cells = {c["name"]: c for c in document["cells"]}
    assert list(cells) == CELLS

    # Only the cells not recorded ran again: the resumed flow run launched 4, 4096 and ngram, never 2.
    launched = launches(document["tune_id"])
    assert [(s["max_num_seqs"], s["speculative_config"]) for s in launched] == [(4, None), (4096, None), (4, NGRAM)]
    assert [s["stage"] for s in document["prepared"]] == ["preflight", "models", "comm", "image"]

    for name in ("max_num_seqs=2", "max_num_seqs=4", "ngram"):
        cell = cells[name]
        assert cell["verdict"] == "pass", cell
        (point,) = cell["points"]
        assert point["valid"] and point["completed"] == point["num_prompts"] == 10 and point["failed"] == 0
        assert point["figures"]["output_throughput"] > 0 and "p99_e2el_ms" in point["figures"]
        assert cell["engine"]["engines"] == ["0"] and cell["engine"]["max_model_len"] == 2048
        assert cell["engine"]["kv_tokens"] > 0  # the engine's own KV-cache size at start
        # read while the bench ran; tiny prompts fill ~0.05 % of a 1 GiB cache, so a reading may well say 0
        assert cell["kv_cache_usage_peak"] is not None and 0 <= cell["kv_cache_usage_peak"] <= 1
        assert cell["accuracy"] is None  # not asked: said so in the report, never a made-up score
    spec = cells["ngram"]["points"][0]["acceptance"]
    assert spec and 0 < spec["acceptance_rate"] <= 1 and len(spec["per_position"]) == 2
    # judged VALID against the local profile's reference curve for this draft (bench.speculative_reference)
    assert document["config"]["bench"]["speculative_reference"] == {"2": 2.76}, document["config"]["bench"]
    assert spec["mean_acceptance_length"] >= 2.76 * 0.9 and cells["ngram"]["points"][0]["reasons"] == []
    assert cells["max_num_seqs=2"]["points"][0]["acceptance"] is None

    rejected = cells["rejected"]
    assert rejected["verdict"] == "fail" and rejected["failed_stage"] == "launch"
    assert rejected["failure"]["failure_class"] == "configuration"  # the engine refused its arguments (pydantic)
    assert "max_num_seqs (4096)" in rejected["failure"]["evidence"], rejected["failure"]
    assert [s["verdict"] for s in rejected["stages"]] == ["fail", "skipped", "skipped", "pass"]  # torn down
    assert "■■ cell rejected: fail: configuration" in out.stderr
    assert "Recommended: " in out.stdout and "Not known: accuracy was not measured" in out.stdout

    # Nothing of the tune is left running.
    assert not any(bed["state"].glob("*/pid")) and port_free(18000)
    report = Path(line.removeprefix("tune record: ")).with_name("tune.html")
    page = report.read_text()
    assert page.count("<svg") == 1 and "<script" not in page
    if CHROMIUM is not None:  # .ci/run installs it
        chromium_draws_the_frontier(report, bed["folder"])


def chromium_draws_the_frontier(report: Path, folder: Path) -> None:
    from PIL import Image

    common = [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              f"--user-data-dir={folder / 'chromium'}"]  # fmt: skip
    dom = subprocess.run([*common, "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120)
    # The page as the browser built it: the frontier with each point labelled and the reference marked.
    for text in ("Pareto frontier", "max_num_seqs=2 c2", "max_num_seqs=4 c2", "ngram c2", "reference (max_num_seqs=4)"):
        assert text in dom.stdout, (text, dom.stderr[-2000:])
    assert "rejected" in dom.stdout and "max_num_seqs (4096)" in dom.stdout
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "tune-report-screenshot.png"
    shot.unlink(missing_ok=True)
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1400,2000", report.as_uri()],
                   capture_output=True, timeout=120, check=False)  # fmt: skip
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)

    def painted(colour: str) -> int:
        rgb = tuple(int(colour[i : i + 2], 16) for i in (1, 3, 5))
        return sum(n for n, c in colours if all(abs(a - b) <= 12 for a, b in zip(c, rgb, strict=True)))

    # the frontier's markers (one point at least, and its legend entry), the dominated ones, the reference ring
    drawn = {c: painted(c) for c in (FRONTIER_COLOUR, DOMINATED_COLOUR, REFERENCE_COLOUR)}
    assert all(n > 60 for n in drawn.values()), drawn
