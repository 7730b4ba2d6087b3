"""The rules that tell a dead cluster hold from a live one (plain data, the waiter's own clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from k3deploy.flows.cluster_hold import (
    BEAT_S,
    STALE_S,
    UNRECORDED_S,
    HoldRecord,
    HoldWatch,
    ended_reason,
    same_hold,
    takeover_bound_s,
)

pytestmark = pytest.mark.prefect


def record(**changes) -> HoldRecord:
    base = {"run_id": "7b0e", "run_name": "brave-owl", "since": "2026-12-01T10:00:00+00:00", "lease_id": "l1"}
    return HoldRecord(**(base | changes))


def test_a_record_round_trips_and_a_beat_changes_it():
    r = record(host="worker-a", pid=42)
    assert HoldRecord.parse(r.to_value()) == r
    nxt = r.next_beat()
    assert nxt.beat == r.beat + 1 and nxt.renewed and nxt != r
    assert r.describe() == "run brave-owl (7b0e) on worker-a (pid 42), since 2026-12-01T10:00:00+00:00"


@pytest.mark.parametrize("value", [None, "text", 3, ["a"]])
def test_anything_but_a_record_is_no_record(value):
    assert HoldRecord.parse(value) is None


def test_an_older_record_without_lease_or_beat_still_parses():
    old = HoldRecord.parse({"run_id": "None", "run_name": "k3deploy rerun launch (pid 9)", "since": "x"})
    assert old is not None and old.run_id is None and old.lease_id is None and old.beat == 0
    assert old.describe() == "k3deploy rerun launch (pid 9), since x"


def test_a_record_that_keeps_beating_is_never_stale():
    watch, r = HoldWatch(), record()
    for step in range(20):
        r = r.next_beat() if step % 2 else r  # a new beat every other look, BEAT_S apart
        assert watch.observe(r, now=step * BEAT_S / 2) is None


def test_a_record_unchanged_for_the_stale_time_is_dead_and_not_a_moment_before():
    watch, r = HoldWatch(), record()
    assert watch.observe(r, now=100.0) is None
    assert watch.observe(r, now=100.0 + STALE_S - 0.1) is None
    reason = watch.observe(r, now=100.0 + STALE_S)
    assert reason is not None and f"not renewed for {STALE_S:.0f} s" in reason


@pytest.mark.parametrize("beat_s", [1.0, 2.5, 15.0])
def test_the_stale_time_is_four_of_the_holder_s_own_beats(beat_s):
    """The waiter judges by the beat the holder wrote into its record: no setting the two must agree on."""
    watch, r = HoldWatch(), HoldRecord.parse(record(beat_s=beat_s).to_value())
    assert r is not None and r.beat_s == beat_s
    assert watch.observe(r, now=0.0) is None
    assert watch.observe(r, now=4 * beat_s - 0.01) is None
    reason = watch.observe(r, now=4 * beat_s)
    assert reason is not None and f"it renews every {beat_s:g} s" in reason
    assert takeover_bound_s(beat_s) == 4 * beat_s + 4 and takeover_bound_s() == 64


@pytest.mark.parametrize("beat_s", [None, "fast", 0, -1, 60, True])
def test_a_record_with_no_usable_beat_is_judged_by_the_default(beat_s):
    r = HoldRecord.parse(record().to_value() | {"beat_s": beat_s})
    assert r is not None and r.beat_s == BEAT_S and r.stale_s == STALE_S


def test_a_new_holder_restarts_the_clock():
    watch = HoldWatch()
    watch.observe(record(), now=0.0)
    assert watch.observe(record(run_id="other", lease_id="l2"), now=STALE_S + 1) is None
    assert watch.observe(record(run_id="other", lease_id="l2"), now=2 * STALE_S) is None


def test_a_slot_taken_with_no_record_is_freed_only_after_longer():
    watch = HoldWatch()
    assert watch.observe(None, now=0.0) is None
    assert watch.observe(None, now=STALE_S) is None
    assert "no holder recorded" in (watch.observe(None, now=UNRECORDED_S) or "")


@pytest.mark.parametrize(
    ("state", "dead"),
    [("RUNNING", False), ("PENDING", False), ("SCHEDULED", False), ("CANCELLING", False), ("PAUSED", False),
     ("COMPLETED", True), ("FAILED", True), ("CANCELLED", True), ("CRASHED", True), (None, True)],
)  # fmt: skip
def test_a_holder_whose_flow_run_ended_is_dead_at_once(state, dead):
    reason = ended_reason(state)
    assert (reason is not None) is dead
    if state and dead:
        assert reason == f"its flow run is {state.capitalize()}"


def test_the_age_of_a_renewal_is_read_from_its_timestamp():
    then = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    r = record(renewed=then.isoformat())
    assert r.renewed_age_s(now=then + timedelta(seconds=90)) == 90
    assert record(renewed="not a time").renewed_age_s() is None
    assert record().renewed_age_s() is None


def test_a_renewed_record_is_the_same_hold_and_another_holders_is_not():
    held = record()
    assert same_hold(held.next_beat().next_beat(), held)  # the holder's beats renew it, the hold stays
    assert not same_hold(record(lease_id="another-lease"), held)
    assert not same_hold(record(run_id="another-run"), held)
    assert not same_hold(None, held) and not same_hold(held, None) and same_hold(None, None)
