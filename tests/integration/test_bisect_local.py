"""`k3deploy bisect` on the local profile (real CPU vLLM), as a person runs it after a bad night: what only real
relaunches show, each experiment's own measured figure (a harmful key among two, found across a budget stop
and a resume). The search's other outcomes (not reproducible, a launch failure's culprit) run on the stand-in
(test_bisect_standin.py).

The profile is narrowed to one node and DP rank, and one bench workload, so an experiment (launch, smoke,
bench, teardown) takes about a minute here: what the test shows is the same on two ranks.

The harmful key is `max_num_seqs: 1` under four concurrent requests of 64 tokens (eight in all): each request
waits for up to three others to finish before its first token, so mean TTFT grows several times over (a queue,
not a speed; 66 ms against 553 ms on the idle machine), and that is the figure the bisect judges by. The
machine is shared with the other worker: load slows both ends alike and cannot make the queue vanish. (With
16-token outputs at two clients the effect was a third of the noise on mean TPOT, and a loaded machine made
the good end read like the bad one.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bisect_cli import K3deploy, stage_flow_runs

pytestmark = [pytest.mark.bisect, pytest.mark.cli, pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.prefect, pytest.mark.timeout(1500)]  # fmt: skip
ROOT = Path(__file__).parents[2]
PROFILE = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
# One rank: its engine runs its model in its own process, not in a worker process of its own (vLLM's V1
# multiprocessing off), one vLLM import fewer per start; what relaunches show is the same.
ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def profile(folder: Path, name: str, **serve: Any) -> Path:
    data = json.loads(json.dumps(PROFILE))
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:1]
    data["serve"]["data_parallel_size"] = 1
    data["serve"]["env"] |= ONE_PROCESS
    data["serve"] |= {k: v for k, v in serve.items() if k != "readiness"}
    data["serve"]["readiness"] |= serve.get("readiness", {})
    data["bench"] |= {"prefix_hit": False, "random_output_len": 64, "num_prompts": 8, "max_concurrency": 4}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def cli(prefect_server, tmp_path_factory) -> K3deploy:
    return K3deploy(tmp_path_factory.mktemp("bisect"))


@pytest.fixture(scope="module")
def good(cli: K3deploy) -> str:
    run_id = cli.run(profile(cli.runs.parent, "good"))
    assert json.loads((cli.runs / run_id / "record.json").read_text())["verdict"] == "pass"
    return run_id


def test_two_changed_keys_one_harmful_bisect_names_it_with_both_experiments_figures_reusing_what_passed(
    cli: K3deploy, good: str
):
    bad = cli.run(profile(cli.runs.parent, "two-keys", max_num_seqs=1, readiness={"poll_s": 1}), "--baseline-run", good)
    assert cli.comparison(bad)["verdict"] == "REGRESSED"
    # stopped by its budget after both ends, then resumed: the ends are not run again
    out, first = cli.bisect(bad, "--max-experiments", "2")
    assert out.returncode == 1, out.stdout + out.stderr
    assert first["outcome"]["verdict"] == "undecided" and [e["name"] for e in first["experiments"]] == [
        "bad end",
        "good end",
    ]
    out, document = cli.bisect(bad, "--resume")
    assert out.returncode == 0, out.stdout + out.stderr
    assert document["resumed_from"] == first["bisect_id"] and document["experiments"][:2] == first["experiments"]
    assert document["good_run"] == good and document["bad_run"] == bad
    assert [s["name"] for s in document["suspects"]] == ["serve.max_num_seqs", "serve.readiness.poll_s"]
    assert document["outcome"]["verdict"] == "culprit" and document["outcome"]["culprits"] == ["serve.max_num_seqs"]
    assert "verdict: culprit: serve.max_num_seqs" in out.stdout
    experiments = {e["name"]: e for e in document["experiments"]}
    assert list(experiments) == ["bad end", "good end", "+serve.max_num_seqs"]
    assert [e["reproduces"] for e in experiments.values()] == [True, False, True]
    target = document["target"]
    for e in experiments.values():  # each judged on its own measured figure, shown against both ends
        assert isinstance(e["value"], float) and f"good end {target['good']:.4g}" in e["evidence"]
        assert f"bad end {target['bad']:.4g}" in e["evidence"]
    assert len({e["value"] for e in experiments.values()}) == 3  # three measurements, none reused
    mid = (target["good"] + target["bad"]) / 2
    assert (experiments["+serve.max_num_seqs"]["value"] > mid) is (target["higher_is_better"] is False)
    # models, comm and image came from the two runs' passes: neither bisect ran any of them
    assert stage_flow_runs(first["bisect_id"]) == ["preflight"] + ["launch", "smoke", "bench", "teardown"] * 2
    assert stage_flow_runs(document["bisect_id"]) == ["preflight", "launch", "smoke", "bench", "teardown"]
    for e in experiments.values():
        reused = {s["stage"]: s["reused_from"] for s in e["stages"] if s["reused_from"]}
        assert set(reused) == {"models", "comm", "image"} and set(reused.values()) <= {good, bad}
    assert document["cluster_hours"] > first["cluster_hours"] > 0  # the search's whole cost, both parts
    assert document["saved_cluster_hours"] > first["saved_cluster_hours"] > 0
    assert "node-hours spent" in out.stdout and "saved by reusing stages that passed" in out.stdout
    page = (cli.runs / bad / "report.html").read_text()
    assert f"<section id='bisect-{document['bisect_id']}'>" in page and "culprit: serve.max_num_seqs" in page
