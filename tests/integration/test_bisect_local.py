"""`k3deploy bisect` on the local profile (real CPU vLLM), as a person runs it after a bad night: what only real
relaunches show. Two changes since the last pass, each breaking a stage in the engine's own way: the KV-cache
space not a number (`VLLM_CPU_KVCACHE_SPACE: "0.001"`: vLLM refuses its config at start-up, launch fails) and
the reasoning parser dropped (the server starts, smoke's reasoning check fails). One bisect, stopped by its
budget and resumed, names both — each with its stage and class — and verifies the fix: the bad config with
both reverted passes every planned stage. The search's other outcomes (a figure's culprit, not reproducible)
run on the stand-in (test_bisect_standin.py) and in tests/unit/test_bisect*.py.

The profile is narrowed to one node and DP rank and a short bench, so an experiment that starts a server
(launch, smoke, bench, teardown) takes well under a minute here; a start vLLM refuses, seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.flows.registry import STAGES, stage
from tests.bisect_cli import K3deploy, stage_flow_runs

pytestmark = [pytest.mark.bisect, pytest.mark.cli, pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.prefect, pytest.mark.timeout(1500)]  # fmt: skip
ROOT = Path(__file__).parents[2]
PROFILE = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
# One rank: its engine runs its model in its own process, not in a worker process of its own (vLLM's V1
# multiprocessing off), one vLLM import fewer per start; what relaunches show is the same.
ONE_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def profile(folder: Path, name: str, env: dict[str, str] | None = None, **serve: Any) -> Path:
    data = json.loads(json.dumps(PROFILE))
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:1]
    data["serve"]["data_parallel_size"] = 1
    data["serve"]["env"] |= ONE_PROCESS | (env or {})
    data["serve"] |= serve
    data["bench"] |= {"prefix_hit": False, "num_prompts": 8, "max_concurrency": 4}
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


KV = "serve.env.VLLM_CPU_KVCACHE_SPACE"
REASONING = "serve.reasoning_parser"


def test_two_changes_breaking_launch_and_smoke_are_both_named_with_stage_and_class_and_the_fix_verified(
    cli: K3deploy, good: str
):
    bad = cli.run(profile(cli.runs.parent, "two-changes", env={"VLLM_CPU_KVCACHE_SPACE": "0.001"},
                          reasoning_parser=None))  # fmt: skip
    record = json.loads((cli.runs / bad / "record.json").read_text())
    assert (record["verdict"], record["failed_stage"]) == ("fail", "launch")
    # stopped by its budget after both ends, then resumed: the ends are not run again
    out, first = cli.bisect(bad, "--max-experiments", "2")
    assert out.returncode == 1, out.stdout + out.stderr
    assert first["outcome"]["verdict"] == "undecided"
    assert [e["name"] for e in first["experiments"]] == ["bad end", "good end"]
    out, document = cli.bisect(bad, "--resume")
    assert out.returncode == 0, out.stdout + out.stderr
    assert document["resumed_from"] == first["bisect_id"] and document["experiments"][:2] == first["experiments"]
    assert document["good_run"] == good and document["bad_run"] == bad
    assert [s["name"] for s in document["suspects"]] == [KV, REASONING]
    experiments = {e["name"]: e for e in document["experiments"]}
    assert list(experiments) == ["bad end", "good end", f"+{KV}", f"bad end without {KV}"]
    # each search's finding: its culprit, the stage it breaks, the class, from the engine's own words
    launch, smoke = document["findings"]
    assert (launch["outcome"]["culprits"], launch["target"]["stage"], launch["outcome"]["failure_class"]) == (
        [KV], "launch", "configuration")  # fmt: skip
    assert "invalid literal for int()" in experiments[f"+{KV}"]["failure"]["evidence"]
    assert (smoke["outcome"]["culprits"], smoke["target"]["stage"]) == ([REASONING], "smoke")
    assert smoke["outcome"]["failure_class"] == experiments[f"bad end without {KV}"]["failure"]["failure_class"]
    assert "reasoning" in experiments[f"bad end without {KV}"]["failure"]["evidence"]
    assert document["outcome"]["verdict"] == "culprit" and document["outcome"]["culprits"] == [KV, REASONING]
    # the fix: both reverted is the good end, which ran every stage the bad run planned and passed
    planned = [s["stage"] for s in record["stages"] if s["stage"] not in ("preflight", "teardown")]
    assert document["planned"] == planned
    shown = f"every planned stage ({', '.join(planned)}) passed in good end"
    assert document["fix"] == {"reverted": [KV, REASONING], "experiment": "good end", "passed": True, "evidence": shown}
    assert [s["stage"] for s in experiments["good end"]["stages"] if s["verdict"] != "skipped"] == [
        *planned,
        "teardown",
    ]
    assert f"finding 1: culprit: {KV} (configuration)" in out.stdout
    assert f"fix: reverting {KV}, {REASONING} makes the run pass" in out.stdout
    # the cached stages (models, comm, image, conformance) came from the two runs' passes: neither bisect ran them
    after_launch = [s for s in planned if not stage(s).cached]
    assert stage_flow_runs(first["bisect_id"]) == ["preflight", "launch", "teardown", *after_launch, "teardown"]
    # +KV refused at launch; without KV, smoke fails and the stages after it are skipped
    assert stage_flow_runs(document["bisect_id"]) == ["preflight", "launch", "teardown", "launch", "smoke", "teardown"]
    cached = {s.name for s in STAGES if s.cached}
    for e in experiments.values():  # conformance too, in the experiments that reached it
        reused = {s["stage"]: s["reused_from"] for s in e["stages"] if s["reused_from"]}
        assert {"models", "comm", "image"} <= set(reused) <= cached and set(reused.values()) <= {good, bad}
    assert any(s["stage"] == "conformance" and s["reused_from"] for s in experiments["good end"]["stages"])
    assert document["cluster_hours"] > first["cluster_hours"] > 0  # the search's whole cost, both parts
    assert document["saved_cluster_hours"] > first["saved_cluster_hours"] > 0
    assert "node-hours spent" in out.stdout and "saved by reusing stages that passed" in out.stdout
    page = (cli.runs / bad / "report.html").read_text()
    assert f"<section id='bisect-{document['bisect_id']}'>" in page and f"reverting {KV}, {REASONING} makes" in page
