"""The server watch's pure parts: when an absence starts, ends and is past the grace; how many retries span it; the
rows of a run cut short; Prefect's noise held back and given back."""

from __future__ import annotations

import logging

import pytest

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.stage import StageResult, Verdict
from k3deploy.flows.campaign import Event
from k3deploy.flows.server_watch import Absence, RunSoFar, client_retries, quiet
from tests.configs import site_data

pytestmark = pytest.mark.prefect


def test_an_absence_is_down_once_back_when_answered_and_lost_only_past_the_grace():
    absence = Absence(grace_s=10)
    seen = [absence.observe(answered, at) for answered, at in
            [(True, 0), (False, 2), (False, 4), (True, 6), (False, 8), (False, 17.9), (False, 18), (False, 20),
             (True, 22)]]  # fmt: skip
    assert seen == [None, "down", None, "back", "down", None, "lost", None, None]
    assert absence.lost and absence.away_for(20) == 12


@pytest.mark.parametrize("grace", [10, 60, 120, 600, 3600])
def test_the_clients_retries_outlast_the_grace_and_never_fall_below_prefects_default(grace):
    retries = client_retries(grace)
    waits = [2**n for n in range(1, retries + 1)]  # Prefect's back-off before each retry (jitter aside)
    assert (sum(waits) >= 1.5 * grace and sum(waits[:-1]) < 1.5 * grace) or retries == 5
    assert retries >= 5


def test_a_run_cut_short_has_its_running_stage_inconclusive_and_the_rest_not_run():
    run = RunSoFar(
        "r1",
        "name",
        DeploymentConfig.model_validate(site_data()),
        ["preflight", "launch", "smoke", "bench", "teardown"],
    )
    run(Event("stage", "preflight"))
    run(Event("stage", "preflight", result=StageResult(stage="preflight", verdict=Verdict.PASS)))
    run(Event("progress", "server", outcome="ignored"))
    run(Event("stage", "launch"))
    rows = run.cut_short("the server went away")
    assert [(r.stage, r.verdict) for r in rows] == [("preflight", Verdict.PASS), ("launch", Verdict.INCONCLUSIVE),
                                                   ("smoke", Verdict.SKIPPED), ("bench", Verdict.SKIPPED)]  # fmt: skip
    assert rows[1].reason == "the server went away" and rows[1].failure is not None
    assert rows[1].failure.failure_class == "infrastructure" and rows[2].reason == "not run: the server went away"


def test_a_run_cut_short_in_its_teardown_leaves_teardown_to_the_watch():
    run = RunSoFar("r1", None, DeploymentConfig.model_validate(site_data()), ["preflight", "teardown"])
    run(Event("stage", "preflight", result=StageResult(stage="preflight", verdict=Verdict.PASS)))
    run(Event("stage", "teardown"))
    assert [r.stage for r in run.cut_short("gone")] == ["preflight"]


def test_quiet_holds_back_prefects_internal_errors_and_gives_them_back(caplog):
    noisy = logging.getLogger("prefect._internal.concurrency")
    with quiet():
        assert noisy.disabled and not logging.raiseExceptions
        noisy.error("held back")
    noisy.error("given back")
    assert not noisy.disabled and logging.raiseExceptions
    assert "held back" not in caplog.text
