"""`k3deploy bisect`'s other outcomes, on the stand-in profile (every stage real but the server, which starts in a
second and is told to be slow): a regression the bad end does not reproduce, and a key the models stage refuses
(a max_model_len above the checkpoint's), named with its stage and class, and its fix verified.

A start the real engine refuses, and a second culprit found once the first is reverted, are test_bisect_local.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.bedconfig import write_config
from tests.bisect_cli import K3deploy, stage_flow_runs
from tests.standin_profile import standin_profile
from tests.vllm_env import needs_vllm_env

# The machine is shared (tests/sharing.py): the slow run is 50 ms a token, the others none, so what the other
# worker's load adds to a run's figures is a small part of the gap the judgement reads (the midpoint of the two ends).
pytestmark = [pytest.mark.standin, pytest.mark.bisect, pytest.mark.cli, pytest.mark.e2e, pytest.mark.prefect,
              pytest.mark.vllm, needs_vllm_env]  # fmt: skip


class Site:
    """One stand-in site (one cluster, one checkpoint, one control file) and its variants' configs."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.cli = folder, K3deploy(folder)
        self.data = standin_profile(folder / "site", hub=True)  # models downloads from a local hub

    def config(self, name: str, **serve: Any) -> Path:
        data = json.loads(json.dumps(self.data))
        data["serve"] |= {k: v for k, v in serve.items() if k != "readiness"}
        data["serve"]["readiness"] |= serve.get("readiness", {})
        return Path(write_config(self.folder / f"{name}.yaml", data))

    def nodes_slow(self, slow: bool) -> None:
        """What a noisy neighbour does to the servers, as the stand-in's control file says it (read as it serves)."""
        (self.folder / "site" / "control.json").write_text(json.dumps({"K3SIM_TOKEN_S": "0.05"} if slow else {}))


@pytest.fixture(scope="module")
def site(prefect_server, tmp_path_factory) -> Site:
    return Site(tmp_path_factory.mktemp("bisect-standin"))


@pytest.fixture(scope="module")
def good(site: Site) -> str:
    site.nodes_slow(False)
    run_id = site.cli.run(site.config("good"))
    assert json.loads((site.cli.runs / run_id / "record.json").read_text())["verdict"] == "pass"
    return run_id


def test_a_regression_made_by_load_beside_the_run_is_not_reproducible(site: Site, good: str):
    noisy = site.config("noisy", readiness={"poll_s": 1})  # a harmless change, made while the nodes were slow
    site.nodes_slow(True)
    try:
        bad = site.cli.run(noisy, "--baseline-run", good)
    finally:
        site.nodes_slow(False)
    assert site.cli.comparison(bad)["verdict"] == "REGRESSED"
    out, document = site.cli.bisect(bad, "--good", good)
    assert out.returncode == 0, out.stdout + out.stderr
    assert document["outcome"]["verdict"] == "not reproducible"
    assert "the bad end, run again, does not reproduce it" in document["outcome"]["reason"]
    assert [(e["name"], e["reproduces"]) for e in document["experiments"]] == [("bad end", False)]
    assert "verdict: not reproducible" in out.stdout


def test_a_key_refused_before_launch_is_named_with_its_stage_and_class_and_its_fix_verified(site: Site, good: str):
    bad = site.cli.run(site.config("too-long", max_model_len=10**6))
    record = json.loads((site.cli.runs / bad / "record.json").read_text())
    assert (record["verdict"], record["failed_stage"]) == ("fail", "models")  # above the checkpoint's 4096
    assert "serve.max_model_len" in record["failure"]["evidence"]
    out, document = site.cli.bisect(bad, "--good", good)  # whatever other runs passed since (a slowed one, say)
    assert out.returncode == 0, out.stdout + out.stderr
    outcome = document["outcome"]
    assert (outcome["verdict"], outcome["culprits"]) == ("culprit", ["serve.max_model_len"])
    assert outcome["failure_class"] == record["failure"]["failure_class"] == "configuration"
    assert [(e["name"], e["reproduces"], e["failed_stage"]) for e in document["experiments"]] == [
        ("bad end", True, "models"),
        ("good end", False, None),
    ]
    assert "verdict: culprit: serve.max_model_len (configuration)" in out.stdout
    # the bad end judged at models, no further (the good end's models pass does not hold for its max_model_len);
    # the good end through every stage the bad run planned: with the one suspect reverted it is the bad config
    # fixed, and it passes
    planned = [s["stage"] for s in record["stages"] if s["stage"] not in ("preflight", "teardown")]
    assert document["planned"] == planned and planned[:3] == ["models", "comm", "image"]
    flows = stage_flow_runs(document["bisect_id"])
    assert flows == ["preflight", "models", *planned[3:], "teardown"], flows
    assert document["fix"]["passed"] is True and "fix: reverting serve.max_model_len makes the run pass" in out.stdout
