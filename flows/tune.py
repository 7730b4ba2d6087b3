"""`tune`: the tutorial's tuning table (seed section 9) as experiments: each server setting relaunched, proved
and measured, the frontier drawn.

It holds the cluster like validate and checks host keys (preflight); models, comm and image run once for
the whole matrix (once per distinct input: a cell with another draft downloads it); then every cell runs
launch (which proves each rank runs the cell's plan and the engine reports its config), smoke, bench and,
when asked, accuracy, then teardown. A cell that fails (a flag the engine rejects, out of memory) is
recorded with its cause and class and the sweep goes on. The record is written after every cell: a Retry
of the same flow run, or `--resume RUN`, runs only the cells not yet recorded.
"""

import json
from typing import Any

from prefect import flow, runtime
from prefect.artifacts import create_markdown_artifact
from prefect.logging import get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.source import resolve_config
from k3deploy.core.errors import ValidateFailed
from k3deploy.core.paths import run_folder
from k3deploy.core.stage import Verdict, now
from k3deploy.flows.campaign import Event, run_attempt, run_stage, start_record, tell
from k3deploy.flows.cluster_lock import hold_cluster
from k3deploy.flows.registry import BY_NAME, STAGES, StageOptions
from k3deploy.flows.run_abort import teardown_on_abort
from k3deploy.flows.tune_matrix import CellSpec, TuneMatrix, cell_config, expand, reference_cell
from k3deploy.records.record import build_record
from k3deploy.records.run_report import share
from k3deploy.records.tune_record import (
    TUNE_HTML,
    TUNE_MD,
    TuneCell,
    TuneRecord,
    cell_of,
    read_tune,
    stage_row,
    write_tune,
)
from k3deploy.records.tune_report import tune_html, tune_markdown
from k3deploy.tasks.stage_cache import stage_inputs_key
from k3deploy.tasks.teardown import remove_servers_task

DEFAULTS = StageOptions()


@flow(name="tune", on_cancellation=[teardown_on_abort], on_crashed=[teardown_on_abort])
def tune(config: str, matrix: TuneMatrix, resume: str = "") -> dict[str, Any]:
    """Server settings × bench workloads and concurrencies, each setting relaunched and measured; the frontier.

    Args:
        config: The name of a saved DeploymentConfig block, or a deployment YAML path on the worker.
        matrix: The cells (server settings: any serve.* key, models.draft, speculative config, prefix caching)
            and the bench workloads and concurrencies every cell runs.
        resume: An earlier tune's id (or unique prefix): its recorded cells are taken over, the rest
            run; empty: a new tune.
    """
    logger = get_run_logger()
    base = resolve_config(config)
    specs = expand(matrix)
    configs = {spec.name: cell_config(base, spec, matrix) for spec in specs}  # every cell checked before any runs
    tune_id = str(runtime.flow_run.id)
    record = _start(tune_id, base, matrix, specs, resume)
    with hold_cluster(base.cluster, runtime.flow_run.id, runtime.flow_run.name):
        record.prepared = prepare(base, list(configs.values()), tune_id)
        write_tune(record)
        failed = next((s for s in record.prepared if s.verdict is Verdict.FAIL), None)
        if failed is not None:
            raise ValidateFailed(f"tune stopped at {failed.stage}: {failed.reason}")
        todo = [spec for spec in specs if spec.name not in record.done()]
        clear_leftovers(list(configs.values()), configs[todo[0].name] if todo else None)
        for spec in specs:
            if spec.name in record.done():
                logger.info("cell %s: recorded already (%s): not run again", spec.name,
                            next(c.verdict for c in record.cells if c.name == spec.name))  # fmt: skip
                continue
            record.cells.append(run_cell(spec, configs[spec.name], matrix, tune_id))
            write_tune(record)
        record.ended_at = now()
    path = write_tune(record)
    report = write_tune_report(record)
    share(tune_id, logger)
    create_markdown_artifact(tune_markdown(record), key="tune", description=f"tune of {len(specs)} cell(s)")
    logger.info("tune record: %s; report: %s", path, report)
    passed = sum(c.verdict == "pass" for c in record.cells)
    return {"tune_id": tune_id, "cells": len(record.cells), "passed": passed, "record": str(path), "report": report}


def _start(tune_id: str, base: DeploymentConfig, matrix: TuneMatrix, specs: list[CellSpec],
           resume: str) -> TuneRecord:  # fmt: skip
    """This tune's record: its own on a Retry, an earlier tune's finished cells on resume, else new."""

    def new() -> TuneRecord:
        return TuneRecord(tune_id=tune_id, tune_name=runtime.flow_run.name, started_at=now(),
                          config_fingerprint=base.fingerprint(), config=base.public(),
                          matrix=matrix.model_dump(mode="json"), reference=reference_cell(matrix, specs, base),
                          nodes=len(base.cluster.nodes))  # fmt: skip

    def earlier() -> TuneRecord:
        found = read_tune(resume)
        if found is None:
            raise ValidateFailed(f"--resume: {resume} is not a tune with a record")
        if found.config_fingerprint != base.fingerprint():
            raise ValidateFailed(f"--resume: tune {found.tune_id} ran another deployment config (fingerprint "
                                 f"{found.config_fingerprint}, this one {base.fingerprint()})")  # fmt: skip
        return found

    def carry(record: TuneRecord, done: TuneRecord) -> None:
        wanted = {s.name: s.set for s in specs}
        record.cells = [c for c in done.cells if _same(wanted.get(c.name), c.settings)]
        record.resumed_from = done.tune_id

    return start_record(read_tune(tune_id), new, earlier if resume else None, carry)


def _same(wanted: dict[str, Any] | None, recorded: dict[str, Any]) -> bool:
    """The cell of that name is still the same setting (a renamed or changed one runs again)."""
    return wanted is not None and json.loads(json.dumps(wanted, default=str)) == recorded


def prepare(base: DeploymentConfig, configs: list[DeploymentConfig], tune_id: str) -> list[Any]:
    """preflight, then models, comm and image once per distinct input among the cells (a Retry reuses passes)."""
    preflight = run_stage(BY_NAME["preflight"], base, {}, tune_id)  # every run checks host keys
    rows = [stage_row(preflight)]
    if not preflight.passed:
        return rows
    names = [s.name for s in STAGES]
    for stage in (s for s in STAGES[: names.index("launch")] if s.cached):  # what comes before a server starts
        distinct = {stage_inputs_key(stage, c, DEFAULTS.model_dump(), tune_id): c for c in configs}
        for cfg in distinct.values():
            result = run_stage(stage, cfg, DEFAULTS.model_dump(), tune_id)
            rows.append(stage_row(result, "this tune" if result.saved_node_seconds else None))
            if not result.passed:
                return rows
    return rows


def clear_leftovers(configs: list[DeploymentConfig], next_cell: DeploymentConfig | None) -> None:
    """Remove what an interrupted tune left of its cells' servers (they hold the ports), except a server of the
    cell that runs next: its launch adopts it (and proves it runs that cell's plan) instead of loading again."""
    keep = next_cell.fingerprint() if next_cell else None
    others = {c.fingerprint(): c for c in configs if c.fingerprint() != keep}
    for cfg in others.values():
        remove_servers_task(cfg, None)


def run_cell(spec: CellSpec, cfg: DeploymentConfig, matrix: TuneMatrix, tune_id: str) -> TuneCell:
    """One attempt of the campaign engine: launch (proved), smoke, bench, accuracy when asked, then teardown; the
    cell's figures from their results."""
    tell(Event("cell", spec.name))
    names = ["launch", *(["smoke"] if matrix.smoke else []), "bench", *(["accuracy"] if matrix.accuracy else [])]
    attempt = run_attempt([BY_NAME[name] for name in names], cfg, {}, tune_id)
    record = build_record(f"{tune_id}:{spec.name}", spec.name, cfg, attempt.results, attempt.started_at, now())
    cell = cell_of(spec.name, json.loads(json.dumps(spec.set, default=str)), record)
    said = cell.failure.describe() if cell.failure else f"{sum(p.valid for p in cell.points)} VALID bench cell(s)"
    get_run_logger().info("cell %s: %s (%s)", spec.name, cell.verdict, said)
    tell(Event("cell", spec.name, outcome=f"{cell.verdict}: {said}"))
    return cell


def write_tune_report(record: TuneRecord) -> str:
    """tune.html and tune.md beside the record; the page's path."""
    folder = run_folder(record.tune_id)
    (folder / TUNE_MD).write_text(tune_markdown(record))
    page = folder / TUNE_HTML
    page.write_text(tune_html(record))
    return str(page)
