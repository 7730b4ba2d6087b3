"""The campaign engine's run loop (flows/campaign.py) with plain functions as stages: what runs, what is skipped
after a failure, what is taken from an earlier pass, when teardown runs, and what the listeners hear. The real
stages through it: validate's, bisect's and tune's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.blocks.loader import load_config
from k3deploy.core.errors import StageFailed
from k3deploy.core.stage import StageResult, Verdict
from k3deploy.flows import campaign
from k3deploy.flows.campaign import Event, run_attempt
from k3deploy.flows.registry import Stage

pytestmark = pytest.mark.prefect
CFG = load_config(Path(__file__).parents[2] / "configs" / "local.yaml")


# What ran is what the listeners heard start: the engine tells every stage it runs, and only those.


def passing(config) -> StageResult:
    return StageResult(stage="a", verdict=Verdict.PASS, summary="fine")


def failing(config) -> StageResult:
    raise StageFailed(StageResult(stage="b", verdict=Verdict.FAIL, reason="broke"))


def broken(config) -> StageResult:
    return config.no_such_setting  # a bug in k3deploy itself: AttributeError


def stage(name: str, function: str) -> Stage:
    return Stage(name, f"tests.unit.test_campaign:{function}", name)


@pytest.fixture
def heard(monkeypatch) -> list[Event]:
    events: list[Event] = []
    monkeypatch.setattr(campaign, "LISTENERS", [events.append])
    return events


def test_after_the_first_failure_every_stage_is_skipped_not_run_and_the_listeners_hear_each_run(heard):
    stages = [stage("a", "passing"), stage("b", "failing"), stage("c", "passing")]
    attempt = run_attempt(stages, CFG, {}, "run-1", teardown=False)
    assert [(r.stage, r.verdict) for r in attempt.results] == [("a", Verdict.PASS), ("b", Verdict.FAIL),
                                                               ("c", Verdict.SKIPPED)]  # fmt: skip
    assert attempt.results[2].reason == "not run: b failed" and attempt.first_failure() is attempt.results[1]
    assert [(e.kind, e.name, e.ended) for e in heard] == [("stage", "a", False), ("stage", "a", True),
                                                          ("stage", "b", False), ("stage", "b", True)]  # fmt: skip
    assert heard[3].result is attempt.results[1]


def test_an_error_in_k3deploy_itself_fails_its_stage_as_the_tools_and_the_attempt_goes_on(heard):
    """Not a project error (a bug): the stage fails naming it, class tool, and what follows is skipped as after any
    failure — so teardown still runs and the record is still written (seen: an AttributeError in a new stage had left
    both ranks serving and no record)."""
    attempt = run_attempt([stage("x", "broken"), stage("c", "passing")], CFG, {}, "run-1", teardown=False)
    failed, skipped = attempt.results
    assert failed.verdict == Verdict.FAIL and failed.failure is not None and failed.failure.failure_class == "tool"
    assert "an error in k3deploy itself: AttributeError" in failed.reason and "no_such_setting" in failed.reason
    assert skipped.verdict == Verdict.SKIPPED and [e.ended for e in heard] == [False, True]


def test_a_stage_taken_from_an_earlier_pass_is_not_run_and_says_whose_pass_it_was(heard):
    earlier = StageResult(stage="b", verdict=Verdict.PASS, summary="from before")
    stages = [stage("a", "passing"), stage("b", "failing")]
    attempt = run_attempt(stages, CFG, {}, "run-1", teardown=False,
                          reuse=lambda s: ("good-run", earlier) if s.name == "b" else None)  # fmt: skip
    assert [e.name for e in heard] == ["a", "a"]  # b was not run
    assert attempt.results[1] is earlier and attempt.reused_from == {"b": "good-run"}
    assert attempt.first_failure() is None


def test_keeping_a_passing_service_up_records_teardown_as_skipped_and_runs_none(heard):
    attempt = run_attempt([stage("a", "passing")], CFG, {}, "run-1", keep_serving=True)
    assert [(r.stage, r.verdict, r.reason) for r in attempt.results][-1] == (
        "teardown",
        Verdict.SKIPPED,
        "keep_serving: the service is left up",
    )
    assert [e.name for e in heard] == ["a", "a"]  # teardown never started


def test_without_teardown_nothing_follows_the_stages(heard):
    attempt = run_attempt([stage("b", "failing")], CFG, {}, "run-1", teardown=False, keep_serving=True)
    assert [r.stage for r in attempt.results] == ["b"]  # a failed run is not kept up, and no teardown was asked


# The one resume rule of a campaign's record: a Retry takes up its own record, a resume carries what an earlier
# one judged into a new record, and otherwise the record is new.


def test_a_retry_takes_up_its_own_record_and_neither_makes_a_new_one_nor_reads_the_earlier():
    own = {"judged": ["a"]}
    made, read = [], []
    chosen = campaign.start_record(own, lambda: made.append(1) or {}, lambda: read.append(1) or {}, lambda r, e: None)
    assert chosen is own and made == [] and read == []


def test_a_resume_carries_the_earlier_records_judged_attempts_into_a_new_record():
    def carry(record: dict, earlier: dict) -> None:
        record["judged"] = list(earlier["judged"])

    chosen = campaign.start_record(None, lambda: {"judged": []}, lambda: {"judged": ["a", "b"]}, carry)
    assert chosen == {"judged": ["a", "b"]}


def test_without_a_record_or_a_resume_the_record_is_new():
    chosen = campaign.start_record(None, lambda: {"judged": []}, None, lambda r, e: r.update(judged=["x"]))
    assert chosen == {"judged": []}
