"""The run record: one versioned JSON document per `validate` run, what the report and regressions read.

Its JSON Schema is `k3deploy/schemas/run-record.schema.json`, generated from RunRecord
(`python3 -m k3deploy.records.record` rewrites it; a test checks it is current).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import K3DeployError, UnreadableEvidence
from k3deploy.core.paths import runs_dir, write_document
from k3deploy.core.stage import AttemptVerdict, FailureCause, StageResult, Verdict

SCHEMA_VERSION: Final = 1
SCHEMA_PATH = Path(__file__).parents[1] / "schemas" / "run-record.schema.json"
RECORD_NAME = "record.json"


def k3deploy_version() -> str:
    try:
        return version("k3deploy")
    except PackageNotFoundError:
        return "unknown"


class Checkpoint(BaseModel):
    role: str
    repo: str
    commit: str
    path: str
    files: int
    bytes: int


class ImageProvenance(BaseModel):
    ref: str
    image_id: str
    digest: str | None = None
    source_revision: str | None = None
    vllm_commit: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)


class ConformanceFigures(BaseModel):
    """The conformance stage's headline (tasks/conformance/score.figures); every case is in its conformance.json."""

    requests: int = Field(ge=0)
    cases: int = Field(ge=0)
    schema_accuracy: dict[str, float] = Field(description="'whole/alone', 'streamed/load', … → valid forced calls")
    statuses: dict[str, int] = Field(description="answers per status: valid, invalid, no-call, empty-delta, …")
    usage_checks: dict[str, int]
    parameter_checks: dict[str, int]
    failed_rules: list[str]
    only_under_load: list[str] = Field(description="cases that failed under load and passed alone")


class CapacityFigures(BaseModel):
    """The capacity stage's answer (tasks/bench/capacity.py); every probe is in its stage data."""

    concurrency: int = Field(ge=0, description="The highest concurrency at which every SLO held (0: none).")
    ending: str = Field(description="How the search ended: found, ceiling, saturated, probes spent, …")
    slo: str = Field(description="The SLOs as words: 'p99 TTFT ≤ 2000 ms, p99 TPOT ≤ 100 ms, goodput ≥ 95%'.")
    line: str = Field(description="The answer as a sentence.")
    below: int | None = Field(default=None, description="The probe at the answer.")
    above: int | None = Field(default=None, description="The lowest probe above it that did not hold.")
    resolution: int = Field(default=1, ge=1, description="How close the bisection brought below and above.")
    probes: int = Field(ge=0)


class SoakFigures(BaseModel):
    """How far the soak got and what drifted (tasks/bench/soak.py); every window is in its stage data."""

    windows: int = Field(ge=0, description="Windows judged, those taken over from an earlier attempt included.")
    minutes: float = Field(ge=0, description="Minutes of load in those windows.")
    planned_minutes: float = Field(gt=0, description="soak.minutes")
    requests: int = Field(ge=0)
    resumed_windows: int = Field(default=0, ge=0, description="Windows an earlier attempt of the run had judged.")
    drifted: list[str] = Field(default_factory=list, description="Drift checks that failed: latency, speed, memory.")
    not_judged: list[str] = Field(default_factory=list, description="Checks too few windows or readings could judge.")


class RunRecord(BaseModel):
    """Everything one validate run saw and concluded; secrets are never part of it."""

    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    run_name: str | None = None
    k3deploy_version: str = Field(default_factory=k3deploy_version)
    started_at: datetime
    ended_at: datetime
    verdict: AttemptVerdict
    failed_stage: str | None = Field(default=None, description="The first stage that failed.")
    failure: FailureCause | None = Field(default=None, description="That stage's failure: class and evidence.")
    config_fingerprint: str
    config: dict[str, Any] = Field(description="The deployment as run, secrets left out (null).")
    node_facts: dict[str, dict[str, Any]] = Field(default_factory=dict, description="node → fact → value")
    host_keys: dict[str, str] = Field(default_factory=dict, description="node → SHA256 host key fingerprint")
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    image: ImageProvenance | None = None
    plan: dict[str, Any] | None = Field(default=None, description="The rendered launch plan (what ran).")
    conformance: ConformanceFigures | None = Field(default=None, description="The served API against the K3 contract.")
    capacity: CapacityFigures | None = Field(default=None, description="The highest concurrency holding the SLOs.")
    soak: SoakFigures | None = Field(default=None, description="The soak's windows and drift.")
    stages: list[StageResult]
    cluster_hours: float = Field(default=0.0, ge=0, description="Node-hours the run held the cluster for its stages.")
    saved_cluster_hours: float = Field(
        default=0.0, ge=0, description="Node-hours not spent again: stages reused from an earlier attempt."
    )

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)

    def cluster_time(self) -> str:
        """'cluster time: 0.0142 node-hours' and what reusing stages that passed saved."""
        line = f"cluster time: {self.cluster_hours:.4g} node-hours"
        saved = self.saved_cluster_hours
        return line + (f" ({saved:.4g} saved by reusing stages that passed)" if saved else "")


# -- the evidence inside a record, read back strictly (history and the report judge by it) ---------------------

Count = Annotated[StrictInt, Field(ge=0)]
FiniteFigure = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class _Evidence(BaseModel):
    model_config = ConfigDict(extra="allow")  # further keys are kept, never judged


class RecordedRun(_Evidence):
    """A bench cell as the bench stage records it (tasks/bench/results.BenchRun)."""

    workload: StrictStr
    concurrency: Annotated[StrictInt, Field(ge=1)]
    num_prompts: Count
    completed: Count
    failed: Count
    failed_reported: StrictBool
    figures: dict[str, FiniteFigure]


class RecordedCell(_Evidence):
    """A bench cell as the bench stage records it (tasks/bench/cells.Cell)."""

    workload: StrictStr
    concurrency: Annotated[StrictInt, Field(ge=1)]
    repeats: Annotated[StrictInt, Field(ge=1)]
    valid: StrictBool
    reasons: list[StrictStr]
    hit_rate: FiniteFigure | None
    achieved_concurrency: FiniteFigure | None
    figures: dict[str, FiniteFigure]
    spread: dict[str, list[FiniteFigure]]


class RecordedScore(_Evidence):
    """A score as the accuracy stage records it (tasks/accuracy/results.Score)."""

    evaluator: StrictStr
    version: StrictStr
    dataset: StrictStr
    metric: StrictStr
    score: FiniteFigure
    completed: Count
    failed: Count
    missing: Count
    unparsed: Count


class BenchEvidence(_Evidence):
    runs: list[RecordedRun] = Field(default_factory=list)
    cells: list[RecordedCell] = Field(default_factory=list)


class AccuracyEvidence(_Evidence):
    scores: list[RecordedScore] = Field(default_factory=list)


EVIDENCE: dict[str, type[_Evidence]] = {"bench": BenchEvidence, "accuracy": AccuracyEvidence}


class UnreadableRecord(UnreadableEvidence):
    """A record the runs store holds but cannot be read: the message is its path and one line of why."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


def _first_problem(err: ValidationError, prefix: str = "") -> str:
    problems = err.errors()
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{prefix}{where}: {first['msg']}{more}"


def load_record(path: Path) -> RunRecord:
    """One record file, with its bench and accuracy evidence checked; UnreadableRecord saying why in one line."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise UnreadableRecord(path, f"cannot be read: {err}") from None
    if not text.strip():
        raise UnreadableRecord(path, "empty")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise UnreadableRecord(path, f"not JSON (cut short?): {err}") from None
    if not isinstance(data, dict):
        raise UnreadableRecord(path, "not a run record (not a JSON object)")
    schema = data.get("schema_version")
    if isinstance(schema, int) and not isinstance(schema, bool) and schema > SCHEMA_VERSION:
        raise UnreadableRecord(path, f"written by a newer k3deploy (schema {schema}; this one reads {SCHEMA_VERSION})")
    try:
        record = RunRecord.model_validate(data)
    except ValidationError as err:
        raise UnreadableRecord(path, _first_problem(err)) from None
    for stage in record.stages:
        model = EVIDENCE.get(stage.stage)
        if model is not None:
            try:
                model.model_validate(stage.data)
            except ValidationError as err:
                raise UnreadableRecord(path, _first_problem(err, f"stages.{stage.stage}.data.")) from None
    return record


@dataclass(frozen=True)
class RecordScan:
    """The runs store: every record read (newest first) and every one that could not be, with why."""

    records: list[RunRecord]
    unreadable: list[UnreadableRecord]


def scan_records(root: Path | None = None) -> RecordScan:
    records, unreadable = [], []
    for path in sorted((root or runs_dir()).glob(f"*/{RECORD_NAME}")):
        try:
            records.append(load_record(path))
        except UnreadableRecord as err:
            unreadable.append(err)
    return RecordScan(sorted(records, key=lambda r: r.started_at, reverse=True), unreadable)


def build_record(
    run_id: str,
    run_name: str | None,
    cfg: DeploymentConfig,
    stages: list[StageResult],
    started_at: datetime,
    ended_at: datetime,
) -> RunRecord:
    """The record of a run from its stages' results: provenance is read from their stage data."""
    by_name = {s.stage: s for s in stages}
    first = next((s for s in stages if s.verdict is Verdict.FAIL), None)
    failed = first.stage if first else None
    cut_short = any(s.verdict is Verdict.INCONCLUSIVE for s in stages)
    preflight = by_name.get("preflight")
    models = by_name.get("models")
    image = by_name.get("image")
    launch = by_name.get("launch")
    conformance = by_name.get("conformance")
    figures = conformance.data.get("figures") if conformance else None
    capacity = by_name.get("capacity")
    soak = by_name.get("soak")
    return RunRecord(
        run_id=run_id,
        run_name=run_name,
        started_at=started_at,
        ended_at=ended_at,
        verdict=Verdict.FAIL if failed else Verdict.INCONCLUSIVE if cut_short else Verdict.PASS,
        failed_stage=failed,
        failure=first.failure if first else None,
        config_fingerprint=cfg.fingerprint(),
        config=cfg.public(),
        node_facts=preflight.data.get("nodes", {}) if preflight else {},
        host_keys=preflight.data.get("host_keys", {}) if preflight else {},
        checkpoints=[
            Checkpoint.model_validate(c)
            for c in (models.data.get("checkpoints", []) if models else [])
            if c.get("commit")
        ],
        image=ImageProvenance.model_validate(image.data) if image and image.data.get("image_id") else None,
        plan=launch.data.get("plan") if launch else None,
        conformance=ConformanceFigures.model_validate(figures) if figures else None,
        capacity=CapacityFigures.model_validate(capacity.data["figures"])
        if capacity and "figures" in capacity.data
        else None,
        soak=SoakFigures.model_validate(soak.data["figures"]) if soak and "figures" in soak.data else None,
        stages=stages,
        cluster_hours=round(sum(s.node_seconds for s in stages) / 3600, 4),
        saved_cluster_hours=round(sum(s.saved_node_seconds for s in stages) / 3600, 4),
    )


def write_record(record: RunRecord, root: Path | None = None) -> Path:
    """runs/<run id>/record.json, written whole (a reader never sees half a record)."""
    return write_document(record.run_id, RECORD_NAME, record, root)


def read_record(run: str, root: Path | None = None) -> RunRecord:
    """A recorded run by its id, or by a unique prefix of it; UnreadableRecord when its file is damaged."""
    base = root or runs_dir()
    matches = sorted(p for p in base.glob(f"{run}*/{RECORD_NAME}")) if run else []
    if not matches:
        raise K3DeployError(f"no recorded run {run!r} in {base}/ (see `k3deploy runs`)")
    if len(matches) > 1:
        raise K3DeployError(f"{run!r} matches {len(matches)} runs in {base}/; give more of the run id")
    return load_record(matches[0])


def json_schema() -> dict[str, Any]:
    schema = RunRecord.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://k3deploy/run-record/v{SCHEMA_VERSION}"
    return schema


if __name__ == "__main__":
    SCHEMA_PATH.parent.mkdir(exist_ok=True)
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2) + "\n")
    print(f"wrote {SCHEMA_PATH}")
