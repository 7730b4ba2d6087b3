"""`k3deploy bisect` on the local profile (real CPU vLLM), as a person runs it after a bad night.

One passing run is shared by the module; each test makes its own bad run and bisects it. The profile is
narrowed to one node and DP rank, and one bench workload, so an experiment (launch, smoke, bench, teardown)
takes about a minute here: what the tests show is the same on two ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

from k3deploy.bisect_record import BISECT_SCHEMA_PATH

pytestmark = [pytest.mark.bisect, pytest.mark.cli, pytest.mark.e2e, pytest.mark.vllm, pytest.mark.prefect,
              pytest.mark.timeout(1500)]  # fmt: skip
ROOT = Path(__file__).parents[2]
PROFILE = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())


def profile(folder: Path, name: str, **serve: Any) -> Path:
    data = json.loads(json.dumps(PROFILE))
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:1]
    data["serve"]["data_parallel_size"] = 1
    data["serve"] |= {k: v for k, v in serve.items() if k != "readiness"}
    data["serve"]["readiness"] |= serve.get("readiness", {})
    data["bench"]["prefix_hit"] = False
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class K3deploy:
    """The CLI in a subprocess, against the tests' Prefect server and one runs store."""

    def __init__(self, folder: Path) -> None:
        from prefect.settings import PREFECT_API_URL

        self.runs = folder / "runs"
        self.env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "COLUMNS": "200",
                    "K3DEPLOY_RUNS_DIR": str(self.runs), "K3DEPLOY_HOME": str(folder / "home")}  # fmt: skip

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "k3deploy", *args]
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=1400, cwd=ROOT)

    def run(self, config: Path, *args: str) -> str:
        out = self("run", "-c", str(config), *args)
        (line,) = [line for line in out.stdout.splitlines() if line.startswith("run record: ")]
        return Path(line.removeprefix("run record: ")).parent.name

    def comparison(self, run_id: str) -> dict[str, Any]:
        return json.loads((self.runs / run_id / "comparison.json").read_text())

    def bisect(self, run_id: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        out = self("bisect", run_id, *args)
        lines = [line for line in out.stdout.splitlines() if line.startswith("bisect record: ")]
        assert lines, out.stdout + out.stderr
        document = json.loads(Path(lines[0].removeprefix("bisect record: ")).read_text())
        jsonschema.validate(document, json.loads(BISECT_SCHEMA_PATH.read_text()))
        return out, document


@pytest.fixture(scope="module")
def cli(prefect_server, tmp_path_factory) -> K3deploy:
    return K3deploy(tmp_path_factory.mktemp("bisect"))


@pytest.fixture(scope="module")
def good(cli: K3deploy) -> str:
    run_id = cli.run(profile(cli.runs.parent, "good"))
    assert json.loads((cli.runs / run_id / "record.json").read_text())["verdict"] == "pass"
    return run_id


def stage_flow_runs(bisect_id: str) -> list[str]:
    """The stage subflows the bisect's flow run started, by name, in order."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[bisect_id]))
        )
        names = {r.flow_id: client.read_flow(r.flow_id).name for r in runs}
    return [names[r.flow_id] for r in sorted(runs, key=lambda r: r.created)]


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


def hog() -> subprocess.Popen[bytes]:
    """A busy process at nice -5 in a session of its own, whose autogroup is niced -5 as well.

    With autogroups on (Linux's default, and this machine's), CPU is shared between sessions first and a nice
    counts only within one: vLLM runs in its own session (setsid), so busy processes in pytest's session got
    half the machine whatever their nice, and in one CI run the loaded run's TTFT stayed within 3 % of the good
    run's. Niced as a session, each hog outweighs vLLM's session about three to one."""
    busy = subprocess.Popen(["nice", "-n", "-5", sys.executable, "-c", "while True: pass"], start_new_session=True)
    autogroup = Path(f"/proc/{busy.pid}/autogroup")
    if autogroup.exists():  # a kernel without autogroups shares by each process's nice alone
        autogroup.write_text("-5")
    return busy


@contextmanager
def load_beside() -> Iterator[None]:
    """What a noisy neighbour does to a run's figures: two busy processes on this 2-core machine that take about
    three quarters of it from the run (see hog)."""
    hogs = [hog() for _ in range(2)]
    try:
        yield
    finally:
        for busy in hogs:
            busy.kill()
            busy.wait(timeout=30)


def test_a_regression_made_by_load_beside_the_run_is_not_reproducible(cli: K3deploy, good: str):
    noisy = profile(cli.runs.parent, "noisy", readiness={"poll_s": 1})  # a harmless change, and load
    with load_beside():
        bad = cli.run(noisy, "--baseline-run", good)
    assert cli.comparison(bad)["verdict"] == "REGRESSED"
    out, document = cli.bisect(bad, "--good", good)
    assert out.returncode == 0, out.stdout + out.stderr
    assert document["outcome"]["verdict"] == "not reproducible"
    assert "the bad end, run again, does not reproduce it" in document["outcome"]["reason"]
    assert [(e["name"], e["reproduces"]) for e in document["experiments"]] == [("bad end", False)]
    assert "verdict: not reproducible" in out.stdout


def test_a_key_that_makes_launch_fail_is_named_with_the_failures_class(cli: K3deploy, good: str):
    bad = cli.run(profile(cli.runs.parent, "too-long", max_model_len=10**6))
    record = json.loads((cli.runs / bad / "record.json").read_text())
    assert (record["verdict"], record["failed_stage"]) == ("fail", "launch")
    out, document = cli.bisect(bad, "--good", good)  # whatever other runs passed since (a loaded one, say)
    assert out.returncode == 0, out.stdout + out.stderr
    outcome = document["outcome"]
    assert (outcome["verdict"], outcome["culprits"]) == ("culprit", ["serve.max_model_len"])
    assert outcome["failure_class"] == record["failure"]["failure_class"] == "engine"
    assert [(e["name"], e["reproduces"], e["failed_stage"]) for e in document["experiments"]] == [
        ("bad end", True, "launch"),
        ("good end", False, None),
    ]
    assert "verdict: culprit: serve.max_model_len (engine)" in out.stdout
    flows = stage_flow_runs(document["bisect_id"])
    assert flows == ["preflight", "launch", "teardown", "launch", "teardown"], flows  # judged at launch: no further
