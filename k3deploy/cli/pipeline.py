"""`k3deploy run`, `rerun`, `teardown`, `plan` and `config-reference`: the pipeline, one stage, what launch runs."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer

from k3deploy.cli.common import (
    Capacity,
    ConfigPath,
    Format,
    FormatOption,
    Fresh,
    FullVerify,
    NoDownload,
    RunsDir,
    Soak,
    SoakRestart,
    err,
    finish,
    flow_log,
    flow_source,
    load,
    out,
    parsed,
    prefect,
    set_runs_dir,
    show_progress,
    stage_options,
)
from k3deploy.core.errors import K3DeployError, StageFailed

if TYPE_CHECKING:
    from collections.abc import Iterator

    from k3deploy.blocks.deployment import DeploymentConfig
    from k3deploy.core.stage import StageResult
    from k3deploy.records.record import RunRecord

commands = typer.Typer()


@commands.command()
def plan(config: ConfigPath, fmt: FormatOption = Format.text) -> None:
    """Print, node by node, the environment, docker run and vllm serve that launch would run."""
    from k3deploy.tasks.render import render_plan

    rendered = render_plan(load(config))
    if fmt is Format.json:
        typer.echo(json.dumps(rendered.to_json(), indent=2))
    else:
        typer.echo(rendered.to_text(), nl=False)


@commands.command("config-reference")
def config_reference() -> None:
    """Print the configuration reference (every key, its default and meaning) as Markdown."""
    from k3deploy.blocks.reference import config_reference as reference

    typer.echo(reference())


@commands.command()
def run(
    config: ConfigPath,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run just this stage (repeatable).")] = None,
    start: Annotated[str | None, typer.Option("--from", help="Run from this stage on.")] = None,
    keep_serving: Annotated[bool, typer.Option("--keep-serving", help="Leave the service up at the end.")] = False,
    fresh: Fresh = False,
    no_download: NoDownload = False,
    full_verify: FullVerify = False,
    capacity: Capacity = False,
    soak: Soak = False,
    soak_restart: SoakRestart = False,
    baseline_run: Annotated[
        str | None, typer.Option("--baseline-run", help="Also judge the figures against this run's (an id or prefix).")
    ] = None,
    runs_dir: RunsDir = None,
) -> None:
    """Run the whole pipeline (validate): preflight → … → launch → smoke → … → bench → accuracy → teardown."""
    from k3deploy.flows.registry import select
    from k3deploy.flows.run_options import BenchOptions

    try:
        select(only, start)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    cfg = load(config)
    set_runs_dir(runs_dir)
    source = flow_source(config)
    with (
        prefect() as info,
        flow_log() as log,
        parsed(source, cfg),
        without_server(cfg.server.grace_seconds, info.ui, log),
    ):
        from k3deploy.flows.validate import validate

        show_progress()
        state = validate(
            config=source,
            only=tuple(only or ()),
            from_stage=start or "preflight",
            stages=stage_options(fresh, no_download, full_verify, capacity, soak, soak_restart),
            bench=BenchOptions(baseline_run=baseline_run or ""),
            keep_serving=keep_serving,
            return_state=True,
        )
    _finish_run(str(state.state_details.flow_run_id), state, info.ui, log)


@contextlib.contextmanager
def without_server(grace_s: float, ui: str, log: Path) -> Iterator[None]:
    """A run outlives its server's absence for `grace_s` (Prefect's client retries that long); past it the run
    ends on its own (flows/server_watch.py) and its table is printed here before the process exits."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    from k3deploy.cli.output import print_record
    from k3deploy.flows.server_watch import ENDED_WITHOUT_SERVER, client_retries
    from k3deploy.records.record import RECORD_NAME

    def show(record: RunRecord) -> None:
        with contextlib.suppress(typer.Exit):
            files = [("run record", RECORD_NAME), ("report", "report.html")]
            finish("run", record.run_id, None, ui, log, record, print_record, files, False, judged_by_record=True)

    ENDED_WITHOUT_SERVER.append(show)
    try:
        with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: client_retries(grace_s)}):
            yield
    finally:
        ENDED_WITHOUT_SERVER.remove(show)


def _finish_run(run_id: str, state: Any, ui: str, log: Path) -> None:
    """The run's stage table, where its record and report are; exit 1 unless it passed."""
    from k3deploy.cli.output import print_record
    from k3deploy.records.record import RECORD_NAME, read_record

    try:
        record = read_record(run_id)
    except K3DeployError:
        record = None
    finish("run", run_id, state, ui, log, record, print_record,
           [("run record", RECORD_NAME), ("report", "report.html")], passed=record is not None and
           record.verdict == "pass", judged_by_record=True)  # fmt: skip


@commands.command()
def rerun(
    target: Annotated[
        str, typer.Argument(help="With -c: the stage to run again. Without: a validate run's id to retry.")
    ],
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Deployment YAML or saved block: run the stage TARGET again alone."),
    ] = None,
    fresh: Fresh = False,
    no_download: NoDownload = False,
    full_verify: FullVerify = False,
    capacity: Capacity = False,
    soak: Soak = False,
    soak_restart: SoakRestart = False,
    teardown_after: Annotated[bool, typer.Option("--teardown-after", help="launch: remove it once ready.")] = False,
    fmt: FormatOption = Format.text,
    runs_dir: RunsDir = None,
) -> None:
    """Retry a finished validate run (the UI's Retry), or with -c run one stage again.

    `k3deploy rerun RUN_ID` runs the same flow run again: the stages that passed with the same inputs are
    not executed again, the failed one and what follows are. `k3deploy rerun -c site.yaml STAGE` runs one
    stage alone; verified work of earlier runs is reused (cached tasks, node manifests).
    """
    set_runs_dir(runs_dir)
    if config is None:
        _retry(target)
        return
    from k3deploy.flows.registry import stage as find

    try:
        chosen = find(target)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    cfg = load(config)
    options = stage_options(fresh, no_download, full_verify, capacity, soak, soak_restart).of(chosen)
    if "teardown_after" in chosen.alone:
        options["teardown_after"] = teardown_after
    _run_one(chosen.name, flow_source(config), cfg, options, fmt)


def _retry(run_id: str) -> None:
    from k3deploy.blocks.fleet import ServerConfig

    with prefect() as info, flow_log() as log, without_server(ServerConfig().grace_seconds, info.ui, log):
        from k3deploy.cli.rerun import retry

        show_progress()
        state = retry(run_id, on_state=err.print)
    _finish_run(str(state.state_details.flow_run_id), state, info.ui, log)


def _run_one(name: str, source: str, cfg: DeploymentConfig, options: dict[str, Any], fmt: Format) -> None:
    from k3deploy.core.stage import held, now
    from k3deploy.flows.registry import FINAL
    from k3deploy.flows.registry import stage as find

    with prefect(), flow_log() as log, parsed(source, cfg):
        # A stage run alone takes the cluster as validate does; teardown is a clean-up, safe any time.
        turn: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if name != FINAL:
            from k3deploy.flows.cluster_lock import hold_cluster

            turn = hold_cluster(cfg.cluster, None, f"k3deploy rerun {name} (pid {os.getpid()})")
        with turn:
            started = now()
            try:
                result: StageResult = find(name).load()(config=source, **options)
            except StageFailed as failed:
                result = failed.result
            result = held(result, len(cfg.cluster.nodes), started, reused=False)
    if fmt is Format.json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        from k3deploy.cli.output import print_stage_result

        print_stage_result(out, result)
        out.print(f"log: {log}")
    if not result.passed:
        raise typer.Exit(1)


@commands.command()
def teardown(config: ConfigPath, fmt: FormatOption = Format.text) -> None:
    """Stop and remove this config's containers on every node, and prove none is left; safe to repeat."""
    _run_one("teardown", flow_source(config), load(config), {}, fmt)
