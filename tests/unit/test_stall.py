"""The stall detector on REAL /metrics readings of vLLM 0.32 (CPU), two DP ranks, DP rank 1 stopped (SIGSTOP).

Recorded by tests/data/launch/record_metrics.py: `running-*` while both ranks worked, `stuck-*` five seconds
apart while EngineCore_DP1 was stopped with requests in its batch, `idle` after the requests ended.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.tasks.watch.stall import EngineReading, StallDetector, Stuck, readings

DATA = Path(__file__).parents[1] / "data" / "launch" / "vllm-0.32.0" / "metrics"

pytestmark = pytest.mark.launch


def reading(name: str) -> dict[str, EngineReading]:
    return readings((DATA / f"{name}.txt").read_text())


def test_readings_take_running_requests_and_token_counters_per_engine():
    running = reading("running-1")
    assert set(running) == {"0", "1"}
    assert all(r.running > 0 for r in running.values())
    later = reading("running-2")
    assert all(later[e].tokens > running[e].tokens for e in running)  # counters move every step
    assert all(r.running == 0 for r in reading("idle").values())


def test_a_stopped_rank_with_requests_is_stuck_once_the_timeout_passed():
    detector = StallDetector(timeout_s=60)
    assert detector.observe(0.0, reading("stuck-1")) == []
    assert detector.observe(30.0, reading("stuck-2")) == []  # not yet
    assert detector.observe(60.0, reading("stuck-2")) == [Stuck("1", 2, 60.0)]  # rank 0 kept moving: not named


def test_working_ranks_and_idle_ranks_are_never_stuck():
    detector = StallDetector(timeout_s=5)
    assert detector.observe(0.0, reading("running-1")) == []
    assert detector.observe(100.0, reading("running-2")) == []  # a long gap, but the counters moved
    assert detector.observe(200.0, reading("idle")) == []
    assert detector.observe(900.0, reading("idle")) == []  # nothing running: standing still is right


def test_the_clock_restarts_when_a_rank_moves_again():
    detector = StallDetector(timeout_s=60)
    detector.observe(0.0, reading("running-1"))
    detector.observe(50.0, reading("running-1"))
    assert detector.observe(55.0, reading("running-2")) == []  # moved at 55 s
    assert detector.observe(100.0, reading("running-2")) == []  # 45 s since
    assert [s.engine for s in detector.observe(115.0, reading("running-2"))] == ["0", "1"]
