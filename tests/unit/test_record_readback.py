"""Run records read back honestly: REAL records of the local profile (tests/data/history/local-cpu), damaged
as a disk, a crash or another version would damage them. `runs`, `report` and `report --compare` name each
one they cannot read in one line; a figure that history or a baseline has and the run lacks is MISSING."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from k3deploy.cli.app import app
from k3deploy.records.history import RegressionVerdict, comparable, compare
from k3deploy.records.record import UnreadableRecord, load_record, scan_records

pytestmark = pytest.mark.report
HISTORY = Path(__file__).parents[1] / "data" / "history" / "local-cpu"
REAL = sorted(HISTORY.glob("*-unchanged.json"))
OUTPUT = "bench random c2 output_throughput"


def store(tmp_path: Path, damage: dict[str, str]) -> Path:
    """A runs store of the real unchanged records; `damage`: run folder name → the text its record gets."""
    for path in REAL:
        run_id = json.loads(path.read_text())["run_id"]
        (tmp_path / run_id).mkdir()
        shutil.copy(path, tmp_path / run_id / "record.json")
    for name, text in damage.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text(text)
    return tmp_path


def edited(change: Any) -> str:
    data = json.loads(REAL[-1].read_text())
    data["run_id"] = "edited"
    change(data)
    return json.dumps(data)


def bench_run(data: dict[str, Any]) -> dict[str, Any]:
    stage = next(s for s in data["stages"] if s["stage"] == "bench")
    return stage["data"]["runs"][0]


NAN_SCORE = {"evaluator": "lm_eval", "version": "0.4.13", "dataset": "x", "metric": "m", "score": float("nan"),
             "completed": 1, "failed": 0, "missing": 0, "unparsed": 0}  # fmt: skip


def accuracy_data(data: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in data["stages"] if s["stage"] == "accuracy")["data"]


DAMAGE = {
    "truncated": (REAL[0].read_text()[:700], "not JSON (cut short?)"),
    "empty": ("", "empty"),
    "future": (edited(lambda d: d.update(schema_version=2)),
               "written by a newer k3deploy (schema 2; this one reads 1)"),
    "no-completed": (edited(lambda d: bench_run(d).pop("completed")),
                     "stages.bench.data.runs.0.completed: Field required"),
    "string-figure": (edited(lambda d: bench_run(d)["figures"].update(output_throughput="fast")),
                      "stages.bench.data.runs.0.figures.output_throughput: Input should be a valid number"),
    "nan-score": (edited(lambda d: accuracy_data(d).update(scores=[NAN_SCORE])),
                  "stages.accuracy.data.scores.0.score: Input should be a finite number"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_each_damaged_record_is_one_line_naming_the_file(tmp_path, name):
    text, reason = DAMAGE[name]
    (tmp_path / "record.json").write_text(text)
    with pytest.raises(UnreadableRecord) as unreadable:
        load_record(tmp_path / "record.json")
    said = str(unreadable.value)
    assert said.startswith(f"{tmp_path}/record.json: {reason}") and "\n" not in said


def test_the_real_records_read_whole():
    assert all(load_record(path).verdict == "pass" for path in REAL)


def test_runs_lists_what_it_reads_and_names_each_record_it_cannot(tmp_path):
    root = store(tmp_path, {name: text for name, (text, _reason) in DAMAGE.items()})
    result = CliRunner().invoke(app, ["runs", "--runs-dir", str(root)], terminal_width=200)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("unreadable: ")]
    assert len(lines) == len(DAMAGE)
    for name, (_text, reason) in DAMAGE.items():
        assert f"unreadable: {root}/{name}/record.json: {reason}" in lines[sorted(DAMAGE).index(name)]
    assert all(json.loads(p.read_text())["run_id"][:8] in result.output for p in REAL)
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_report_of_a_damaged_record_is_one_line_and_exit_1(tmp_path, name):
    root = store(tmp_path, {name: DAMAGE[name][0]})
    for extra in ([], ["--compare"]):
        result = CliRunner().invoke(app, ["report", name, "--runs-dir", str(root), *extra], terminal_width=200)
        assert result.exit_code == 1, result.output
        assert isinstance(result.exception, UnreadableRecord)  # main() prints it as one line: below
        assert str(result.exception).startswith(f"{root}/{name}/record.json: {DAMAGE[name][1]}")


def test_a_vanished_figure_is_missing_never_a_pass(tmp_path):
    root = store(tmp_path, {"edited": edited(lambda d: bench_run(d)["figures"].pop("output_throughput"))})
    scan = scan_records(root)
    run = next(r for r in scan.records if r.run_id == "edited")
    result = compare(run, scan.records)
    assert result.verdict is RegressionVerdict.MISSING
    row = next(m for m in result.metrics if m.key == OUTPUT)
    assert row.verdict is RegressionVerdict.MISSING and row.value is None
    assert re.search(r"the run has no such figure; (every bench cell|\d+ earlier passing run\(s\)) has it", row.reason)
    cli = CliRunner().invoke(app, ["report", "edited", "--compare", "--runs-dir", str(root)], terminal_width=250)
    assert cli.exit_code == 1 and "MISSING" in cli.output and "missing" in cli.output, cli.output


def test_a_vanished_figure_with_no_history_is_still_missing():
    data = json.loads(edited(lambda d: bench_run(d)["figures"].pop("mean_ttft_ms")))
    from k3deploy.records.record import RunRecord

    result = compare(RunRecord.model_validate(data), [])
    assert result.verdict is RegressionVerdict.MISSING
    assert [m.key for m in result.metrics if m.verdict is RegressionVerdict.MISSING] == ["bench random c2 mean_ttft_ms"]


def failed_at_launch(data: dict[str, Any]) -> None:
    """The real record as a run that failed at launch: the engine refused, nothing after it ran."""
    data.update(verdict="fail", failed_stage="launch",
                failure={"failure_class": "engine", "evidence": "EngineCore failed to start."})  # fmt: skip
    for stage in data["stages"]:
        if stage["stage"] == "launch":
            stage.update(verdict="fail", reason="EngineCore failed to start.", data={})
        elif stage["stage"] in ("smoke", "bench", "accuracy"):
            stage.update(verdict="skipped", reason="launch failed", findings=[], data={})


def test_a_run_that_failed_before_bench_says_once_that_its_figures_were_not_measured(tmp_path):
    root = store(tmp_path, {"edited": edited(failed_at_launch)})
    scan = scan_records(root)
    run = next(r for r in scan.records if r.run_id == "edited")
    result = compare(run, scan.records)
    assert result.verdict is RegressionVerdict.INCONCLUSIVE and result.metrics == []  # not a MISSING row per figure
    assert result.why == "failed at launch (engine) before bench: its figures were not measured"
    assert result.history_runs and result.history_runs == [r.run_id for r in comparable(run, scan.records, 10)]
    cli = CliRunner().invoke(app, ["report", "edited", "--compare", "--runs-dir", str(root)], terminal_width=250)
    assert "MISSING" not in cli.output and cli.output.count("its figures were not measured") == 1, cli.output
    page = (root / "edited" / "report.html").read_text()
    assert "MISSING" not in page and "The run failed at launch (engine) before bench" in page
    # A run that failed at bench itself measured, or could have: its lost figures stay MISSING (never a pass).
    at_bench = edited(lambda d: (bench_run(d)["figures"].pop("output_throughput"), d.update(failed_stage="bench")))
    assert compare(load_record_text(at_bench), scan.records).verdict is RegressionVerdict.MISSING


def load_record_text(text: str) -> Any:
    from k3deploy.records.record import RunRecord

    return RunRecord.model_validate(json.loads(text))


def test_compare_names_the_records_history_left_out(tmp_path):
    root = store(tmp_path, {"truncated": DAMAGE["truncated"][0]})
    newest = json.loads(REAL[-1].read_text())["run_id"]
    cli = CliRunner().invoke(app, ["report", newest, "--compare", "--runs-dir", str(root)], terminal_width=250)
    assert f"left out of the history, unreadable: {root}/truncated/record.json: not JSON" in cli.output, cli.output
    comparison = json.loads((root / newest / "comparison.json").read_text())
    assert comparison["unreadable"][0].startswith(f"{root}/truncated/record.json: not JSON")


def test_the_command_line_prints_one_line_and_no_traceback(tmp_path):
    import subprocess
    import sys

    root = store(tmp_path, {"future": DAMAGE["future"][0]})
    done = subprocess.run([sys.executable, "-m", "k3deploy", "report", "future", "--runs-dir", str(root)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout
    assert done.stderr.strip().splitlines() == [f"k3deploy: error: {root}/future/record.json: {DAMAGE['future'][1]}"]


def with_output_length(tokens: float) -> Any:
    def change(data: dict[str, Any]) -> None:
        for stage in data["stages"]:
            if stage["stage"] == "bench":  # records from before cells: a cell per run (history.bench_cells)
                for cell in stage["data"].get("cells", stage["data"].get("runs", [])):
                    cell["figures"]["mean_output_tokens"] = tokens

    return change


@pytest.mark.parametrize(("tokens", "verdict"), [(16.0, "PASS"), (17.5, "PASS"), (14.0, "REGRESSED"),
                                                 (8.0, "REGRESSED"), (18.0, "REGRESSED")])  # fmt: skip
def test_without_ignore_eos_a_mean_output_length_beyond_ten_percent_either_way_is_never_a_pass(
    tmp_path, tokens, verdict
):
    """Runs measured without --ignore-eos keep their answers' mean length; a run whose answers are another length
    (a truncating server) is not comparable, whichever way its speed went."""
    root = tmp_path / "store"
    root.mkdir()
    for path in REAL:
        data = json.loads(path.read_text())
        with_output_length(16.0)(data)
        (root / data["run_id"]).mkdir()
        (root / data["run_id"] / "record.json").write_text(json.dumps(data))
    (root / "edited").mkdir()
    (root / "edited" / "record.json").write_text(edited(with_output_length(tokens)))
    scan = scan_records(root)
    run = next(r for r in scan.records if r.run_id == "edited")
    row = next(m for m in compare(run, scan.records).metrics if m.key == "bench random c2 mean_output_tokens")
    assert row.verdict == verdict, row.reason
    assert row.reason.startswith(f"{tokens:.4g} tokens a request, {(tokens - 16) / 16:+.1%} from the median of ")
