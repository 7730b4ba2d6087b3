"""The capacity search's logic (tasks/bench/capacity.py): probes judged against SLOs, the next step, the answer.

A probe here is a bench cell made from a stated server model (latency as a function of concurrency), so each test
knows the answer in advance; the search on the real server is tests/integration/test_capacity_local.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from k3deploy.blocks.capacity import CapacityConfig, CapacitySlo
from k3deploy.core.stage import StageResult, Verdict
from k3deploy.records.history import RegressionVerdict, compare
from k3deploy.records.load_report import capacity_charts
from k3deploy.records.record import CapacityFigures, RunRecord
from k3deploy.records.report import markdown
from k3deploy.tasks.bench.capacity import (
    Answer,
    Probe,
    broken,
    judge,
    nearest_below,
    next_step,
    percentile_key,
    probe_prompts,
    queue_wait_ms,
    slo_figures,
)
from k3deploy.tasks.bench.capacity_probes import as_dict
from k3deploy.tasks.bench.cells import Cell

pytestmark = pytest.mark.bench

Server = Callable[[int], Cell]


def cell(c: int, ttft: float, tpot: float = 10.0, *, median_ttft: float | None = None, good: float = 1.0,
         reasons: list[str] | None = None, achieved: float | None = None) -> Cell:  # fmt: skip
    """A VALID (unless `reasons`) cell at concurrency c with these p99 figures; goodput a fraction of requests."""
    figures = {"p99_ttft_ms": ttft, "p99_tpot_ms": tpot, "median_ttft_ms": median_ttft or ttft / 2,
               "request_throughput": 2.0, "request_goodput": 2.0 * good, "output_throughput": 100.0 * c}  # fmt: skip
    return Cell("random", c, 1, not reasons, reasons or [], [], 300, 300, 0.0,
                c * 0.95 if achieved is None else achieved, figures, {})  # fmt: skip


def search(server: Server, conf: CapacityConfig) -> tuple[Answer, list[Probe]]:
    """The search's loop as the stage runs it (tasks/bench/capacity.pysteps.Search), over a server model."""
    probes: list[Probe] = []
    while True:
        step = next_step(probes, conf, 0.0)
        if isinstance(step, Answer):
            return step, probes
        assert step not in [p.concurrency for p in probes], f"probed {step} twice: {[p.concurrency for p in probes]}"
        probes.append(judge(server(step), conf, nearest_below(probes, step)))


def linear(base: float, per_request: float) -> Server:
    """p99 TTFT rising linearly with concurrency, the median in step: no queueing."""
    return lambda c: cell(c, base + per_request * c)


def conf(**kw: object) -> CapacityConfig:
    slo = kw.pop("slo", {"ttft_ms": 420})
    return CapacityConfig.model_validate({"slo": slo, "max_concurrency": 64, **kw})


def test_doubling_then_bisection_finds_the_highest_concurrency_holding_the_slo_with_the_probes_around_it():
    answer, probes = search(linear(100, 50), conf())  # 100 + 50c ≤ 420 up to c = 6
    assert (answer.concurrency, answer.ending) == (6, "found")
    assert [p.concurrency for p in probes] == [1, 2, 4, 8, 6, 7]
    assert answer.below is not None and answer.below.concurrency == 6 and answer.below.holds
    assert answer.above is not None and answer.above.concurrency == 7 and answer.above.holds is False
    assert "p99 TTFT 450 ms > 420 ms" in answer.why


@pytest.mark.parametrize("start", [1, 3, 5])
def test_every_capacity_from_none_to_the_ceiling_is_found_exactly_in_a_bounded_number_of_probes(start: int):
    """Cases no example chose: every threshold from 0 to the ceiling, from several starts."""
    for capacity in range(0, 65):
        limit = 100 + 10 * capacity + 5  # holds up to `capacity`, breaks above
        answer, probes = search(linear(100, 10), conf(slo={"ttft_ms": limit}, start=start, max_probes=20))
        assert answer.concurrency == min(capacity, 64), (capacity, [p.concurrency for p in probes])
        expected = "ceiling" if capacity >= 64 else "nothing holds" if capacity == 0 else "found"
        assert answer.ending == expected, (capacity, answer)
        assert len(probes) <= 14  # log2(64) doublings + log2(64) bisections, and a start off the powers of two


def test_resolution_stops_the_bisection_once_holding_and_breaking_are_that_close():
    answer, _probes = search(linear(100, 10), conf(slo={"ttft_ms": 100 + 10 * 37}, resolution=4))
    assert answer.ending == "found" and answer.above is not None
    below, above = answer.concurrency, answer.above.concurrency
    assert 0 < above - below <= 4 and below <= 37 < above


def test_a_median_ttft_growing_faster_than_the_concurrency_stops_the_search_at_that_probe_naming_it():
    """Queueing past the server's slots: up to 8 the median TTFT stays; at 16 half the requests wait a whole
    request: it grows 4 × for 2 × the concurrency. Nothing above 16 is probed; the SLO itself is loose."""

    def server(c: int) -> Cell:
        median = 200.0 if c <= 8 else 200.0 * 4 * c / 16
        return cell(c, 300.0 if c <= 8 else 900.0, median_ttft=median)

    answer, probes = search(server, conf(slo={"ttft_ms": 5000}))
    assert [p.concurrency for p in probes] == [1, 2, 4, 8, 16]
    assert answer.ending == "saturated" and probes[-1].saturated is not None
    assert "median TTFT 800 ms at concurrency 16 is 4.00 × its 200 ms at 8" in answer.why
    assert "2.00 × as fast, above capacity.ttft_growth 1.5" in answer.why
    assert answer.concurrency == 16  # it held its SLO there all the same: the answer, with no probe above


def test_a_probe_that_cannot_reach_its_concurrency_is_saturation_not_evidence_and_nothing_above_runs():
    def server(c: int) -> Cell:
        if c < 16:
            return cell(c, 300.0)
        said = f"run 1: achieved concurrency {c * 0.3:.2f} of {c} requested, below bench.validity.min_concurrency_ratio"
        return cell(c, 300.0, reasons=[said], achieved=c * 0.3)

    answer, probes = search(server, conf(slo={"ttft_ms": 5000}))
    assert [p.concurrency for p in probes] == [1, 2, 4, 8, 16]  # no bisection past a saturated server either
    assert answer.concurrency == 8 and answer.ending == "saturated" and answer.above is not None
    assert answer.above.concurrency == 16 and answer.above.holds is None and answer.above.saturated
    assert "over-saturated at concurrency 16, so no probe above it ran: run 1: achieved concurrency 4.80" in answer.why


def test_a_probe_with_failed_requests_is_no_evidence_and_ends_the_search_failed():
    def server(c: int) -> Cell:
        return cell(c, 300.0, reasons=["run 1: 290 of 300 requests completed, 10 failed"] if c == 4 else None)

    answer, _probes = search(server, conf(slo={"ttft_ms": 5000}))
    assert answer.ending == "invalid probe" and not answer.passed and answer.concurrency == 2
    assert "the probe at concurrency 4 is no evidence: run 1: 290 of 300 requests completed, 10 failed" in answer.why


def test_bounds_on_probes_and_minutes_end_the_search_with_the_bracket_so_far():
    answer, probes = search(linear(100, 1), conf(slo={"ttft_ms": 150}, max_probes=3))
    assert answer.ending == "probes spent" and len(probes) == 3 and answer.concurrency == 4
    assert "it held up to 4, nothing above was probed" in answer.why
    done = [judge(cell(1, 100.0), conf(), None)]
    timed = next_step(done, conf(max_minutes=5), 5.0)
    assert isinstance(timed, Answer) and timed.ending == "minutes spent" and timed.concurrency == 1


def test_the_engines_own_queue_counters_show_requests_waiting_for_a_slot_and_stop_the_search():
    """Real /metrics of the local profile's vLLM 0.32 around a probe at concurrency 16 on 8 slots (SOURCES.md):
    128 requests waited 126.9 ms each in the engines' queues, 80 % of the probe's median TTFT (159.5 ms)."""
    data = Path(__file__).parents[1] / "data" / "bench"
    before = (data / "vllm-0.32.0-queue-c16-metrics-before.txt").read_text()
    after = (data / "vllm-0.32.0-queue-c16-metrics-after.txt").read_text()
    waited = queue_wait_ms(before, after)
    assert waited == pytest.approx(126.896, abs=0.001)
    assert queue_wait_ms(before, before) is None and queue_wait_ms("", after) is None  # no request, no counter
    probe = judge(cell(16, 400.0, median_ttft=159.5), conf(slo={"ttft_ms": 5000}), None, queue_ms=waited)
    assert probe.holds and probe.saturated is not None
    said = "requests waited 126.9 ms each on average in the engines' queues at concurrency 16"
    assert probe.saturated.startswith(f"{said} (vllm:request_queue_time_seconds), 80% of the median TTFT")
    calm = judge(cell(8, 400.0, median_ttft=86.1), conf(slo={"ttft_ms": 5000}), None, queue_ms=0.7)
    assert calm.saturated is None  # 0.7 ms of 86 ms: no queue to speak of


def test_goodput_below_its_floor_breaks_the_slo_and_every_figure_is_named_against_its_limit():
    slo = CapacitySlo(percentile=99, ttft_ms=500, tpot_ms=20, goodput=0.9)
    held, broke = broken(slo_figures(cell(4, 300.0, 25.0, good=0.85), slo), slo)
    assert held == ["p99 TTFT 300 ms ≤ 500 ms"]
    assert broke == ["p99 TPOT 25 ms > 20 ms", "goodput 85.0% < 90%"]
    # a figure the run does not report breaks its SLO, named by vllm bench's key
    _, missing = broken({"goodput_fraction": 1.0}, CapacitySlo(percentile=99.9, ttft_ms=500, tpot_ms=None))
    assert missing == ["p99.9 TTFT: not in the result (p99.9_ttft_ms)"]
    assert percentile_key(CapacitySlo(percentile=90, ttft_ms=None, tpot_ms=5), "tpot") == "p90_tpot_ms"


def test_a_probe_sends_enough_prompts_for_its_percentile_and_its_concurrency():
    assert probe_prompts(2, conf(slo={"ttft_ms": 1, "percentile": 99}), 0.95) == 299  # ln(0.05)/ln(0.99)
    assert probe_prompts(2, conf(slo={"ttft_ms": 1, "percentile": 90}), 0.95) == 29
    assert probe_prompts(64, conf(slo={"ttft_ms": 1, "percentile": 90}), 0.95) == 64 * 8


def test_the_config_refuses_an_slo_without_a_latency_and_a_start_above_the_ceiling():
    with pytest.raises(ValidationError, match="needs ttft_ms, tpot_ms or both"):
        CapacitySlo(ttft_ms=None, tpot_ms=None, goodput=0.9)
    with pytest.raises(ValidationError, match="start 16 is above max_concurrency 8"):
        CapacityConfig(start=16, max_concurrency=8)
    assert CapacitySlo(ttft_ms=2000, tpot_ms=50).describe() == "p99 TTFT ≤ 2000 ms, p99 TPOT ≤ 50 ms, goodput ≥ 95%"


# -- the answer in the record, the history and the report ---------------------------------------------------------

HISTORY = Path(__file__).parents[1] / "data" / "history" / "local-cpu"
UNCHANGED = [RunRecord.model_validate_json(p.read_text()) for p in sorted(HISTORY.glob("*unchanged*.json"))]
SLO = CapacitySlo(percentile=99, ttft_ms=400, tpot_ms=50)


def with_capacity(record: RunRecord, concurrency: int, ending: str = "found") -> RunRecord:
    """A real recorded run of the local profile, given a capacity stage that found `concurrency`."""
    probes = [judge(linear(100, 50)(c), conf(slo={"ttft_ms": 400, "tpot_ms": 50}), None)
              for c in (1, 2, 4, 8, 6, 7)]  # fmt: skip
    figures = {"concurrency": concurrency, "ending": ending, "slo": SLO.describe(), "line": f"holds {concurrency}",
               "below": concurrency, "above": concurrency + 1, "resolution": 1, "probes": len(probes)}  # fmt: skip
    stage = StageResult(stage="capacity", verdict=Verdict.PASS, data={
        "probes": [as_dict(p) for p in probes], "slo": SLO.model_dump(), "figures": figures})  # fmt: skip
    return record.model_copy(update={"capacity": CapacityFigures.model_validate(figures),
                                     "stages": [*record.stages, stage]})  # fmt: skip


@pytest.mark.report
def test_a_capacity_below_every_earlier_answer_is_regressed_and_one_step_of_noise_is_not():
    history = [with_capacity(r, 12) for r in UNCHANGED[:4]]
    key = f"capacity at {SLO.describe()}"
    dropped = compare(with_capacity(UNCHANGED[4], 8), history, last=10)
    row = next(m for m in dropped.metrics if m.key == key)
    assert row.verdict is RegressionVerdict.REGRESSED and row.value == 8 and row.median == 12
    assert "worse than every one of 4 earlier runs (12)" in row.reason
    noisy = next(m for m in compare(with_capacity(UNCHANGED[4], 11), history, last=10).metrics if m.key == key)
    assert noisy.verdict is RegressionVerdict.PASS  # the search's resolution is one step
    # against a baseline run: "capacity dropped from 12 to 8", and a run that did not search misses nothing
    against = compare(with_capacity(UNCHANGED[4], 8), [], last=10, baseline=history[0])
    assert any(m.key == key and m.verdict is RegressionVerdict.REGRESSED and "8 misses baseline run" in m.reason
               for m in against.metrics)  # fmt: skip
    unsearched = compare(UNCHANGED[4], history, last=10)
    assert not [m for m in unsearched.metrics if m.key.startswith("capacity")]
    bounded = compare(with_capacity(UNCHANGED[4], 2, ending="probes spent"), history, last=10)
    assert not [m for m in bounded.metrics if m.key.startswith("capacity")]  # a bound is not an answer


@pytest.mark.report
def test_the_report_shows_the_probes_the_answer_and_charts_with_the_slo_lines():
    record = with_capacity(UNCHANGED[0], 6)
    text = markdown(record, None, {})
    assert "## Capacity" in text and "holds 6." in text and "| 6 | holds | answer |" in text
    assert "| 7 | breaks | above |" in text
    charts = capacity_charts(record)
    assert len(charts) == 2 and all(c.startswith("<svg") for c in charts)
    assert "SLO p99 TTFT 400 ms" in charts[0] and "holds 6" in charts[0] and "SLO goodput 95 %" in charts[1]
