"""The `k3deploy` command line.

Every command validates the configuration before anything else starts, and any failure ends as
one clear message and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import click
import typer
from rich.console import Console

from k3deploy.errors import ConfigError, K3DeployError, StageFailed

if TYPE_CHECKING:
    from k3deploy.blocks.deployment import DeploymentConfig
    from k3deploy.server import ServerInfo
    from k3deploy.stage import StageResult

app = typer.Typer(
    help="Bring up Kimi-K3 W4A8 on vLLM-Ascend from bare nodes to a validated, benchmarked service.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
server_app = typer.Typer(help="The local Prefect server k3deploy starts when PREFECT_API_URL is not set.")
app.add_typer(server_app, name="server")

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

ConfigPath = Annotated[
    Path, typer.Option("--config", "-c", help="Deployment YAML (see configs/), or a saved DeploymentConfig block.")
]
RunsDir = Annotated[
    Path | None, typer.Option("--runs-dir", help="Runs store (default $K3DEPLOY_RUNS_DIR, else ./runs).")
]


class Format(StrEnum):
    text = "text"
    json = "json"


FormatOption = Annotated[Format, typer.Option("--format", "-f", help="text for people, or json.")]


@app.callback()
def options(debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of a failure.")] = False) -> None:
    """Global options (before the command)."""


def _config(source: Path) -> DeploymentConfig:
    """The deployment, validated before Prefect or any node is touched."""
    from k3deploy.blocks.loader import load_config

    if source.exists() or source.suffix in (".yaml", ".yml") or "/" in str(source):
        return load_config(source)
    from k3deploy.blocks.source import resolve_config

    with _prefect():  # a saved block's name: the server holds it
        return resolve_config(str(source))


def _source(source: Path) -> str:
    """What a flow is given: an absolute path (a worker's folder may differ), or the block's name."""
    return str(source.resolve()) if source.exists() else str(source)


def _set_runs_dir(runs_dir: Path | None) -> None:
    if runs_dir is not None:
        os.environ["K3DEPLOY_RUNS_DIR"] = str(runs_dir)


@contextlib.contextmanager
def _prefect() -> Iterator[ServerInfo]:
    """The Prefect server for this command (started once, reused), with the settings the CLI runs under."""
    from k3deploy import server

    info = server.ensure(lambda line: err.print(line))
    with server.using(info):
        yield info


@app.command()
def plan(config: ConfigPath, fmt: FormatOption = Format.text) -> None:
    """Print, node by node, the environment, docker run and vllm serve that launch would run."""
    from k3deploy.tasks.render import render_plan

    rendered = render_plan(_config(config))
    if fmt is Format.json:
        typer.echo(json.dumps(rendered.to_json(), indent=2))
    else:
        typer.echo(rendered.to_text(), nl=False)


@app.command("config-reference")
def config_reference() -> None:
    """Print the configuration reference (every key, its default and meaning) as Markdown."""
    from k3deploy.blocks.reference import config_reference as reference

    typer.echo(reference())


def _stage_names() -> list[str]:
    from k3deploy.flows.registry import STAGES

    return [s.name for s in STAGES]


@app.command()
def run(
    config: ConfigPath,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run just this stage (repeatable).")] = None,
    start: Annotated[str | None, typer.Option("--from", help="Run from this stage on.")] = None,
    keep_serving: Annotated[bool, typer.Option("--keep-serving", help="Leave the service up at the end.")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="Run comm's checks even if a pass is recent.")] = False,
    no_download: Annotated[bool, typer.Option("--no-download", help="Fail instead of downloading.")] = False,
    runs_dir: RunsDir = None,
) -> None:
    """Run the whole pipeline (validate): preflight → … → launch → smoke → bench → accuracy → teardown."""
    from k3deploy.flows.registry import select

    try:
        select(only, start)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    _config(config)
    _set_runs_dir(runs_dir)
    with _prefect() as info:
        from k3deploy.cli_output import StageProgress, print_record
        from k3deploy.flows.validate import LISTENERS, validate
        from k3deploy.record import RECORD_NAME, read_record
        from k3deploy.record import runs_dir as runs_dir_now

        LISTENERS.append(StageProgress(err))
        state = validate(
            config=_source(config),
            only=only or None,
            from_stage=start,
            keep_serving=keep_serving,
            fresh=fresh,
            download=not no_download,
            return_state=True,
        )
    run_id = str(state.state_details.flow_run_id)
    try:
        record = read_record(run_id)
    except K3DeployError:
        state.result()  # no record: the run failed before it could write one; raise why
        raise
    out.print()
    print_record(out, record)
    out.print(f"run record: {(runs_dir_now() / run_id / RECORD_NAME).resolve()}")
    out.print(f"Prefect UI: {info.ui}/runs/flow-run/{run_id}")
    if record.verdict != "pass":
        raise typer.Exit(1)


@app.command()
def rerun(
    config: ConfigPath,
    stage: Annotated[str, typer.Argument(help="The stage to run again (see `k3deploy run --help`).")],
    fresh: Annotated[bool, typer.Option("--fresh", help="comm: run the checks even if a pass is recent.")] = False,
    no_download: Annotated[bool, typer.Option("--no-download", help="models: fail instead of downloading.")] = False,
    teardown_after: Annotated[bool, typer.Option("--teardown-after", help="launch: remove it once ready.")] = False,
    fmt: FormatOption = Format.text,
    runs_dir: RunsDir = None,
) -> None:
    """Run one stage again; verified work of earlier runs is reused (cached tasks, node manifests)."""
    from k3deploy.flows.registry import stage as find

    try:
        chosen = find(stage)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    _config(config)
    _set_runs_dir(runs_dir)
    options = {"fresh": fresh, "download": not no_download, "teardown_after": teardown_after}
    _run_one(chosen.name, _source(config), {k: v for k, v in options.items() if k in chosen.options}, fmt)


def _run_one(name: str, source: str, options: dict[str, Any], fmt: Format) -> None:
    from k3deploy.flows.registry import stage as find

    with _prefect():
        try:
            result: StageResult = find(name).load()(config=source, **options)
        except StageFailed as failed:
            result = failed.result
    if fmt is Format.json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        from k3deploy.cli_output import print_stage_result

        print_stage_result(out, result)
    if not result.passed:
        raise typer.Exit(1)


@app.command()
def teardown(config: ConfigPath, fmt: FormatOption = Format.text) -> None:
    """Stop and remove this config's containers on every node, and prove none is left; safe to repeat."""
    _config(config)
    _run_one("teardown", _source(config), {}, fmt)


@app.command()
def runs(runs_dir: RunsDir = None) -> None:
    """List the recorded runs, newest first."""
    from k3deploy.cli_output import runs_table
    from k3deploy.record import list_records
    from k3deploy.record import runs_dir as store

    _set_runs_dir(runs_dir)
    records = list_records()
    if not records:
        out.print(f"no recorded runs in {store()}/")
        return
    out.print(runs_table(records))


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix), from `k3deploy runs`.")],
    fmt: FormatOption = Format.text,
    runs_dir: RunsDir = None,
) -> None:
    """Show a run's record as a readable summary (`--format json`: the record itself)."""
    from k3deploy.cli_output import print_record
    from k3deploy.record import read_record

    _set_runs_dir(runs_dir)
    record = read_record(run_id)
    if fmt is Format.json:
        typer.echo(record.model_dump_json(indent=2))
    else:
        print_record(out, record)


@server_app.command("status")
def server_status() -> None:
    """Say which Prefect server the CLI uses."""
    from k3deploy import server

    info = server.recorded()
    out.print(f"running at {info.ui} (pid {info.pid})" if info else "not running; the next command starts it")


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server k3deploy started (its runs stay in its database)."""
    from k3deploy import server

    info = server.stop()
    out.print(f"stopped the server at {info.ui}" if info else "no k3deploy Prefect server is running")


def _fail(message: str) -> NoReturn:
    for line in message.strip().splitlines() or ["failed"]:
        print(f"k3deploy: error: {line.strip()}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    debug = "--debug" in sys.argv[1:]
    try:
        code = app(standalone_mode=False)  # a typer.Exit comes back as its code here, not raised
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as usage:
        usage.show()
        sys.exit(usage.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        err.print("k3deploy: interrupted")
        sys.exit(130)
    except ConfigError as error:
        if debug:
            traceback.print_exc()
        _fail("\n".join(error.lines))
    except K3DeployError as error:
        if debug:
            traceback.print_exc()
        _fail(str(error))
    except Exception as error:  # a bug or an unexpected library error: still one message
        if debug:
            raise
        _fail(f"{type(error).__name__}: {error} (run again with --debug for the traceback)")
