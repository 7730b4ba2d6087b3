"""The run record: one versioned JSON document per `validate` run, what the report and regressions read.

Its JSON Schema is `k3deploy/schemas/run-record.schema.json`, generated from RunRecord
(`python3 -m k3deploy.record` rewrites it; a test checks it is current).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, Field, SecretStr

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.stage import StageResult, Verdict

SCHEMA_VERSION: Final = 1
SCHEMA_PATH = Path(__file__).with_name("schemas") / "run-record.schema.json"
RECORD_NAME = "record.json"


def runs_dir() -> Path:
    """The runs store: $K3DEPLOY_RUNS_DIR, else ./runs; one folder per run (record, logs)."""
    return Path(os.environ.get("K3DEPLOY_RUNS_DIR", "runs"))


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


class RunRecord(BaseModel):
    """Everything one validate run saw and concluded; secrets are never part of it."""

    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    run_name: str | None = None
    k3deploy_version: str = Field(default_factory=k3deploy_version)
    started_at: datetime
    ended_at: datetime
    verdict: Literal["pass", "fail"]
    failed_stage: str | None = Field(default=None, description="The first stage that failed.")
    config_fingerprint: str
    config: dict[str, Any] = Field(description="The deployment as run, secrets left out (null).")
    node_facts: dict[str, dict[str, Any]] = Field(default_factory=dict, description="node → fact → value")
    host_keys: dict[str, str] = Field(default_factory=dict, description="node → SHA256 host key fingerprint")
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    image: ImageProvenance | None = None
    plan: dict[str, Any] | None = Field(default=None, description="The rendered launch plan (what ran).")
    stages: list[StageResult]

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.stage == name), None)


def public_config(cfg: DeploymentConfig) -> dict[str, Any]:
    """The config as JSON with every secret set to null (not masked: a mask still says a secret exists)."""

    def clean(value: Any) -> Any:
        if isinstance(value, SecretStr):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k != "block_type_slug"}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    plain = clean(cfg.model_dump(mode="python"))
    return json.loads(json.dumps(plain, default=str))


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
    failed = next((s.stage for s in stages if s.verdict is Verdict.FAIL), None)
    preflight = by_name.get("preflight")
    models = by_name.get("models")
    image = by_name.get("image")
    launch = by_name.get("launch")
    return RunRecord(
        run_id=run_id,
        run_name=run_name,
        started_at=started_at,
        ended_at=ended_at,
        verdict="fail" if failed else "pass",
        failed_stage=failed,
        config_fingerprint=cfg.fingerprint(),
        config=public_config(cfg),
        node_facts=preflight.data.get("nodes", {}) if preflight else {},
        host_keys=preflight.data.get("host_keys", {}) if preflight else {},
        checkpoints=[
            Checkpoint.model_validate(c)
            for c in (models.data.get("checkpoints", []) if models else [])
            if c.get("commit")
        ],
        image=ImageProvenance.model_validate(image.data) if image and image.data.get("image_id") else None,
        plan=launch.data.get("plan") if launch else None,
        stages=stages,
    )


def write_record(record: RunRecord, root: Path | None = None) -> Path:
    """runs/<run id>/record.json, written whole (a reader never sees half a record)."""
    folder = (root or runs_dir()) / record.run_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECORD_NAME
    partial = path.with_suffix(".json.partial")
    partial.write_text(record.model_dump_json(indent=2) + "\n")
    partial.replace(path)
    return path


def read_record(run: str, root: Path | None = None) -> RunRecord:
    """A recorded run by its id, or by a unique prefix of it."""
    from k3deploy.errors import K3DeployError

    base = root or runs_dir()
    matches = sorted(p for p in base.glob(f"{run}*/{RECORD_NAME}")) if run else []
    if not matches:
        raise K3DeployError(f"no recorded run {run!r} in {base}/ (see `k3deploy runs`)")
    if len(matches) > 1:
        raise K3DeployError(f"{run!r} matches {len(matches)} runs in {base}/; give more of the run id")
    return RunRecord.model_validate_json(matches[0].read_text())


def list_records(root: Path | None = None) -> list[RunRecord]:
    """Every readable record in the runs store, newest first."""
    out = []
    for path in (root or runs_dir()).glob(f"*/{RECORD_NAME}"):
        try:
            out.append(RunRecord.model_validate_json(path.read_text()))
        except ValueError:
            continue
    return sorted(out, key=lambda r: r.started_at, reverse=True)


def json_schema() -> dict[str, Any]:
    schema = RunRecord.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://k3deploy/run-record/v{SCHEMA_VERSION}"
    return schema


if __name__ == "__main__":
    SCHEMA_PATH.parent.mkdir(exist_ok=True)
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2) + "\n")
    print(f"wrote {SCHEMA_PATH}")
