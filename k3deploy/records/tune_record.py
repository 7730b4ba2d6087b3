"""The tune record: one JSON document per tune, written after every cell, and what each cell measured.

It lives in runs/<tune id>/tune.json (no record.json there: history never takes a cell for a run). A cell's
figures are read from the run record its stages make (tasks' own StageResults): the bench cells'
requests and figures, the engine's own report at launch (KV-cache size), the fullest the KV cache got during
the bench, draft acceptance per position, accuracy scores with their sample accounting.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, Field, ValidationError

from k3deploy.core.errors import K3DeployError
from k3deploy.core.paths import read_documents, runs_dir, write_document
from k3deploy.core.stage import AttemptVerdict, FailureCause, StageResult
from k3deploy.records.bisect_record import ExperimentStage
from k3deploy.records.history import bench_cells
from k3deploy.records.record import RunRecord

TUNE_SCHEMA_VERSION: Final = 1
TUNE_NAME = "tune.json"
TUNE_HTML, TUNE_MD = "tune.html", "tune.md"  # its report, beside it


class TunePoint(BaseModel):
    """One bench cell (workload × concurrency) of one server setting."""

    workload: str
    concurrency: int
    valid: bool
    reasons: list[str] = Field(default_factory=list, description="Why the bench cell is not evidence (INVALID).")
    completed: int
    num_prompts: int
    failed: int = Field(description="Requests that failed over the cell's runs.")
    figures: dict[str, float] = Field(default_factory=dict, description="Medians over the runs (vllm bench keys).")
    acceptance: dict[str, Any] | None = Field(default=None, description="Draft acceptance over the first run.")


class TuneCell(BaseModel):
    """One server setting: relaunched, proved, measured, torn down."""

    name: str
    settings: dict[str, Any] = Field(description="The dotted config keys this cell set.")
    verdict: AttemptVerdict
    failed_stage: str | None = None
    failure: FailureCause | None = Field(default=None, description="Why the cell failed: class and evidence.")
    started_at: datetime
    ended_at: datetime
    stages: list[ExperimentStage]
    points: list[TunePoint] = Field(default_factory=list)
    engine: dict[str, Any] = Field(default_factory=dict, description="What the engine reported of itself at launch.")
    kv_cache_usage_peak: float | None = Field(default=None, description="Fullest KV cache read during the bench (0-1).")
    accuracy: list[dict[str, Any]] | None = Field(default=None, description="Scores with sample accounting; null: "
                                                                            "not measured.")  # fmt: skip
    node_seconds: float = Field(ge=0)


class TuneRecord(BaseModel):
    schema_version: Literal[1] = TUNE_SCHEMA_VERSION
    tune_id: str
    tune_name: str | None = None
    started_at: datetime
    ended_at: datetime | None = Field(default=None, description="null while it runs or when it stopped early.")
    config_fingerprint: str
    config: dict[str, Any] = Field(description="The deployment the cells vary, secrets left out (null).")
    matrix: dict[str, Any] = Field(description="The matrix as given.")
    reference: str | None = Field(default=None, description="The cell marked as the reference configuration.")
    nodes: int = Field(ge=1)
    prepared: list[ExperimentStage] = Field(default_factory=list, description="preflight, models, comm, image: once.")
    cells: list[TuneCell] = Field(default_factory=list)
    resumed_from: str | None = Field(default=None, description="The tune whose finished cells this one took over.")

    def done(self) -> set[str]:
        return {c.name for c in self.cells}


def stage_row(result: StageResult, reused_from: str | None = None) -> ExperimentStage:
    return ExperimentStage(stage=result.stage, verdict=result.verdict, reason=result.reason,
                           node_seconds=result.node_seconds, saved_node_seconds=result.saved_node_seconds,
                           reused_from=reused_from)  # fmt: skip


def cell_of(name: str, settings: dict[str, Any], record: RunRecord) -> TuneCell:
    """The cell's outcome and figures, from the run record its stages made."""
    launch, bench, accuracy = (record.stage(s) for s in ("launch", "bench", "accuracy"))
    runs = bench.data.get("runs", []) if bench else []
    points = []
    for c in bench_cells(record):
        mine = [r for r in runs if r["workload"] == c["workload"] and r["concurrency"] == c["concurrency"]]
        points.append(TunePoint(
            workload=c["workload"], concurrency=c["concurrency"], valid=c["valid"], reasons=c.get("reasons", []),
            completed=c["completed"], num_prompts=c["num_prompts"],
            failed=sum(r.get("failed", 0) for r in mine), figures=c.get("figures", {}),
            acceptance=mine[0].get("speculative") if mine else None,
        ))  # fmt: skip
    return TuneCell(
        name=name, settings=settings, verdict=record.verdict, failed_stage=record.failed_stage,
        failure=record.failure, started_at=record.started_at, ended_at=record.ended_at,
        stages=[stage_row(s) for s in record.stages], points=points,
        engine=launch.data.get("engine", {}) if launch else {},
        kv_cache_usage_peak=bench.data.get("kv_cache_usage_peak") if bench else None,
        accuracy=list(accuracy.data.get("scores", [])) if accuracy and accuracy.verdict.value != "skipped" else None,
        node_seconds=round(sum(s.node_seconds for s in record.stages), 1),
    )  # fmt: skip


def write_tune(record: TuneRecord, root: Path | None = None) -> Path:
    """runs/<tune id>/tune.json, written whole."""
    return write_document(record.tune_id, TUNE_NAME, record, root)


def all_tunes(root: Path | None = None) -> list[TuneRecord]:
    """Every readable tune of the runs store, newest first."""
    return sorted(read_documents(TUNE_NAME, TuneRecord, root), key=lambda r: r.started_at, reverse=True)


def read_tune(tune_id: str, root: Path | None = None) -> TuneRecord | None:
    """The tune's record; None when it wrote none; a unique prefix of the id is enough."""
    base = root or runs_dir()
    path = base / tune_id / TUNE_NAME
    if not path.exists():
        found = sorted(base.glob(f"{tune_id}*/{TUNE_NAME}"))
        if len(found) > 1:
            raise K3DeployError(f"{tune_id!r} names {len(found)} tunes: give more of the id")
        if not found:
            return None
        path = found[0]
    try:
        return TuneRecord.model_validate_json(path.read_text())
    except (OSError, ValidationError, ValueError) as err:
        raise K3DeployError(f"{path}: not a tune record: {str(err).splitlines()[0]}") from None
