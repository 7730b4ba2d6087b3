"""Alerts to a real local webhook receiver: the nightly deployment's failed run and its REGRESSED run each
deliver one message with run, cluster, verdict, failing stage and class, and the report; passing runs none.

A real process worker runs the deployed `nightly` (run now, as its schedule would); the serving side is the
stand-in profile, made slow for the regressed run through its control file (0.02 s a token: the same config,
so nothing in the provenance changed). The receiver is an HTTP server on loopback in this test's process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment

from k3deploy.deployments.definitions import apply
from k3deploy.flows.validate import validate
from tests.bedconfig import write_config
from tests.prefect_runs import finished
from tests.standin_profile import standin_profile
from tests.vllm_env import needs_vllm_env
from tests.webhook import Received, delivered, receiving

# Not alone: the regressed run takes 20 ms a token where the history's passes take none (the stand-in's
# default), a gap no neighbour's load closes; the passes themselves run outside the nightly deployment (no alert).
pytestmark = [pytest.mark.standin, pytest.mark.prefect, pytest.mark.vllm, needs_vllm_env,
              pytest.mark.usefixtures("runs_dir")]  # fmt: skip
TOKEN = "hook-T0KEN-91a"  # in the webhook's path, as chat tools put theirs: never in a message or log


@pytest.fixture
def receiver() -> Iterator[tuple[str, Received]]:
    with receiving(path=f"/hooks/{TOKEN}") as hook:
        yield hook


def report_file(message: dict[str, Any]) -> Path:
    """The report the message links to (a file: URL on the worker, which is this machine)."""
    assert message["report"].startswith("file://"), message["report"]
    return Path(unquote(urlsplit(message["report"]).path))


def nightly(config: str, *stages: str) -> Any:
    run = run_deployment("validate/nightly", parameters={"config": config, "only": list(stages)}, timeout=0)
    return finished(run.id, timeout=600)


def test_a_failed_and_a_regressed_nightly_run_each_alert_once_and_passing_runs_stay_quiet(worker, tmp_path, receiver):
    url, received = receiver
    data = standin_profile(tmp_path)
    data["cluster"]["name"] = "lab-alerts"
    data["alerts"] = {"webhook_url": url}
    config = write_config(tmp_path / "site.yaml", data)
    broken = dict(data, bench={**data["bench"], "extra_args": ["--no-such-flag"]})  # vllm bench refuses it
    failing = write_config(tmp_path / "failing.yaml", broken)
    apply(config, worker)

    # Three passes make the history a regression is judged by (MIN_HISTORY); none of them alerts. History is the
    # cluster's whoever ran it: they run here, in this process, not through the worker (a process start each).
    passes = [validate(config=config, only=["launch", "bench"], return_state=True) for _ in range(3)]
    assert [state.type for state in passes] == [StateType.COMPLETED] * 3
    assert delivered(received) == []

    failed = nightly(failing, "launch", "bench")
    assert failed.state.type is StateType.FAILED
    ((path, message),) = delivered(received)
    assert path == f"/hooks/{TOKEN}"
    assert message["verdict"] == "FAIL" and message["failed_stage"] == "bench" and message["cluster"] == "lab-alerts"
    assert message["failure_class"] == "tool" and "--no-such-flag" in message["cause"]
    assert message["run_id"] == str(failed.id) and message["run_name"] == failed.name
    assert report_file(message).is_file() and message["prefect_run"].endswith(f"/runs/flow-run/{failed.id}")
    assert message["text"].startswith(f"k3deploy: run {failed.name} on cluster lab-alerts: FAIL at bench: tool: ")
    assert TOKEN not in json.dumps(message)

    (tmp_path / "control.json").write_text(json.dumps({"K3SIM_TOKEN_S": "0.02"}))  # the nodes got slower
    regressed = nightly(config, "launch", "bench")
    assert regressed.state.type is StateType.COMPLETED  # every stage passed: the figures regressed
    ((_, message),) = delivered(received)
    assert message["verdict"] == "REGRESSED" and message["failed_stage"] is None and message["cluster"] == "lab-alerts"
    assert message["run_id"] == str(regressed.id)
    comparison = json.loads((report_file(message).parent / "comparison.json").read_text())
    assert comparison["verdict"] == "REGRESSED"

    # the validate deployment's runs (not nightly) never alert unless alerts.every_run
    (tmp_path / "control.json").write_text(json.dumps({}))
    other = run_deployment("validate/validate", parameters={"config": failing, "only": ["launch", "bench"]}, timeout=0)
    assert finished(other.id, timeout=600).state.type is StateType.FAILED
    assert delivered(received) == []
