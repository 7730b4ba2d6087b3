"""The tune's frontier, recommendation and page: pure functions of a tune record."""

from __future__ import annotations

from datetime import UTC, datetime

from k3deploy.core.stage import FailureCause, FailureClass, Verdict
from k3deploy.records.bisect_record import ExperimentStage
from k3deploy.records.tune_record import TuneCell, TunePoint, TuneRecord
from k3deploy.records.tune_report import cell_rows, frontier, points, recommendation, tune_html, tune_markdown

T = datetime(2026, 12, 4, tzinfo=UTC)


def point(c: int, tok_s: float, p99: float, valid: bool = True, **more: object) -> TunePoint:
    figures = {"output_throughput": tok_s, "p99_e2el_ms": p99, "mean_e2el_ms": p99 / 2}
    return TunePoint(workload="random", concurrency=c, valid=valid, completed=20, num_prompts=20, failed=0,
                     figures=figures, **more)  # type: ignore[arg-type]  # fmt: skip


def cell(name: str, *pts: TunePoint, failure: FailureCause | None = None, accuracy: list | None = None) -> TuneCell:
    return TuneCell(name=name, settings={}, verdict="fail" if failure else "pass", failure=failure,
                    failed_stage="launch" if failure else None, started_at=T, ended_at=T,
                    stages=[ExperimentStage(stage="launch", verdict=Verdict.PASS, node_seconds=1)],
                    points=list(pts), engine={"kv_tokens": 1048576}, kv_cache_usage_peak=0.02, accuracy=accuracy,
                    node_seconds=1)  # fmt: skip


def record(*cells: TuneCell, reference: str | None = None) -> TuneRecord:
    return TuneRecord(tune_id="t1", started_at=T, ended_at=T, config_fingerprint="f", config={}, matrix={},
                      reference=reference, nodes=2, cells=list(cells))  # fmt: skip


REJECTED = FailureCause(failure_class=FailureClass.ENGINE, evidence="ValueError: max_num_batched_tokens (2048) must be "
                        "greater than or equal to max_num_seqs (4096).", node="local0", dp_rank=0)  # fmt: skip


def test_the_frontier_keeps_the_undominated_points_per_node():
    tune = record(cell("a", point(2, 100, 900), point(8, 300, 2000)), cell("b", point(2, 90, 950)),
                  cell("c", point(2, 200, 1500)), reference="b")  # fmt: skip
    found = points(tune)
    assert [p.per_node for p in found] == [50, 150, 45, 100]  # output tok/s over 2 nodes
    assert [(p.cell, p.concurrency) for p in frontier(found)] == [("a", 2), ("c", 2), ("a", 8)]  # b is dominated by a


def test_invalid_bench_cells_and_failed_cells_are_never_plotted_or_recommended():
    tune = record(cell("good", point(2, 100, 900)), cell("invalid", point(2, 900, 10, valid=False)),
                  cell("rejected", failure=REJECTED))  # fmt: skip
    assert [p.cell for p in points(tune)] == ["good"]
    said = recommendation(tune)
    assert said[0].startswith("Recommended: **good** at concurrency 2 (random): 50 output tok/s per node")
    assert "Not known: accuracy was not measured for this cell" in " ".join(said)
    rows = {r["cell"]: r for r in cell_rows(tune)}
    assert rows["rejected"]["outcome"].startswith("FAIL at launch: engine: local0 (DP rank 0): ValueError")
    assert "INVALID" in rows["invalid"]["workload"]


def test_the_recommendation_says_its_evidence_against_the_reference_and_what_it_knows():
    score = {"dataset": "k3_arith", "metric": "exact_match", "score": 1.0, "completed": 10, "failed": 0, "missing": 0}
    tune = record(cell("ref", point(2, 100, 900)), cell("fast", point(2, 300, 800), accuracy=[score]), reference="ref")
    said = recommendation(tune)
    assert "**fast**" in said[0] and "from 20 completed requests" in said[0]
    assert "Against the reference ref: 3 × its best throughput per node (50)." in said
    assert not any("accuracy was not measured" in line for line in said)


def test_no_passing_cell_no_recommendation_and_a_page_that_says_so():
    tune = record(cell("rejected", failure=REJECTED))
    assert recommendation(tune)[0].startswith("No recommendation")
    page = tune_html(tune)
    assert "nothing to plot" in page and "<svg" not in page


def test_the_page_is_one_self_contained_file_with_the_frontier_labelled():
    acceptance = {"acceptance_rate": 0.5882, "mean_acceptance_length": 2.11, "per_position": [0.6667, 0.4444]}
    tune = record(cell("seqs-2", point(2, 100, 900)), cell("ngram", point(2, 150, 700, acceptance=acceptance)),
                  cell("<b>x</b>", failure=REJECTED), reference="seqs-2")  # fmt: skip
    page = tune_html(tune)
    assert page.count("<svg") == 1 and "<script" not in page and "src=" not in page
    assert ">seqs-2 c2<" in page and ">ngram c2<" in page  # matplotlib's labels, kept as text
    assert "reference (seqs-2)" in page and "Pareto frontier (random)" in page
    assert "58.8%, length 2.11, per position 67%, 44%" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page  # names are escaped
    assert "| ngram |" in tune_markdown(tune)
