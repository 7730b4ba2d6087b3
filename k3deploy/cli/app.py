"""The `k3deploy` command line.

Every command validates the configuration before anything else starts, and any failure ends as
one clear message and a non-zero exit; `--debug` shows the traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import traceback
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import click
import typer
from rich.console import Console

from k3deploy.cli.store import store_app
from k3deploy.core.errors import ConfigError, K3DeployError, StageFailed
from k3deploy.flows.registry import StageOptions

if TYPE_CHECKING:
    from k3deploy.blocks.deployment import DeploymentConfig
    from k3deploy.cli.server import ServerInfo
    from k3deploy.core.stage import StageResult

app = typer.Typer(
    help="Bring up Kimi-K3 W4A8 on vLLM-Ascend from bare nodes to a validated, benchmarked service.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
server_app = typer.Typer(help="The local Prefect server k3deploy starts when PREFECT_API_URL is not set.")
app.add_typer(server_app, name="server")
cluster_app = typer.Typer(help="Who holds a cluster (one run at a time), and freeing a dead run's hold.")
app.add_typer(cluster_app, name="cluster")
app.add_typer(store_app, name="store")

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


def _stage_flag(field: str, flag: str) -> Any:
    """A flag for one StageOptions field, with the field's description as its help (`--no-…` turns it off)."""
    description = StageOptions.model_fields[field].description or field
    off = flag.startswith("--no-")
    return typer.Option(flag, help=f"{description} This flag turns it off." if off else description)


# The stages' options (flows/registry.py's StageOptions), the same flags for `run` and `rerun`.
Fresh = Annotated[bool, _stage_flag("fresh", "--fresh")]
NoDownload = Annotated[bool, _stage_flag("download", "--no-download")]
FullVerify = Annotated[bool, _stage_flag("full_verify", "--full-verify")]


def _stage_options(fresh: bool, no_download: bool, full_verify: bool) -> StageOptions:
    return StageOptions(fresh=fresh, download=not no_download, full_verify=full_verify)


VERBOSE = {"on": False}


@app.callback()
def options(
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of a failure.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show Prefect's log stream live (it always goes to the log file).")
    ] = False,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Talk to (or serve) a Prefect API off this machine without an auth string; warns every time. "
            "Also K3DEPLOY_INSECURE_API=1.",
        ),
    ] = False,
) -> None:
    """Global options (before the command)."""
    VERBOSE["on"] = verbose
    if insecure:
        from k3deploy.cli.server import INSECURE_ENV

        os.environ[INSECURE_ENV] = "1"


@contextlib.contextmanager
def _flow_log() -> Iterator[Path]:
    """Prefect's log stream of this command into a file under K3DEPLOY_HOME (moved into the run's folder)."""
    from datetime import UTC, datetime

    from k3deploy.cli.run_log import prefect_log
    from k3deploy.cli.server import home

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with prefect_log(home() / "logs" / f"{stamp}-{os.getpid()}.log", VERBOSE["on"]) as path:
        yield path


def _keep_log(log: Path, folder: Path) -> Path:
    """The command's log moved into the run's folder as `prefect.log` (left where it is when it cannot be)."""
    target = folder / "prefect.log"
    try:
        shutil.move(log, target)
    except OSError:
        return log
    return target


def _config(source: Path) -> DeploymentConfig:
    """The deployment, validated before Prefect or any node is touched."""
    from k3deploy.blocks.loader import load_config

    if source.exists() or source.suffix in (".yaml", ".yml") or "/" in str(source):
        return load_config(source)
    from k3deploy.blocks.source import resolve_config

    with _prefect() as info:  # a saved block's name: the server holds it
        cfg = resolve_config(str(source))
    if cfg.cluster.ssh.private_key is not None:
        err.print(f"warning: the DeploymentConfig block {source} keeps the nodes' SSH private key on {info.url}: "
                  "whoever can use that server can read it; give cluster.ssh.private_key_file (a path on the worker "
                  "hosts) instead", soft_wrap=True)  # fmt: skip
    return cfg


def _parsed(source: str, cfg: DeploymentConfig) -> contextlib.AbstractContextManager[None]:
    """Inside, the flows this command runs get `cfg` for `source` instead of parsing it again."""
    from k3deploy.blocks.source import parsed

    return parsed(source, cfg)


def _source(source: Path) -> str:
    """What a flow is given: an absolute path (a worker's folder may differ), or the block's name."""
    return str(source.resolve()) if source.exists() else str(source)


def _set_runs_dir(runs_dir: Path | None) -> None:
    if runs_dir is not None:
        os.environ["K3DEPLOY_RUNS_DIR"] = str(runs_dir)


def _pull_shared_runs() -> None:
    """With a server (PREFECT_API_URL) that has a shared store, its runs first: every worker's, from any host."""
    if not os.environ.get("PREFECT_API_URL"):
        return  # no server named: the runs store on this disk is all there is
    from k3deploy.records.run_report import pull_shared_runs

    with _prefect():
        said = pull_shared_runs()
    if said:
        err.print(f"runs store: {said}", soft_wrap=True)


@contextlib.contextmanager
def _prefect() -> Iterator[ServerInfo]:
    """The Prefect server for this command (started once, reused), with the settings the CLI runs under."""
    from k3deploy.cli import server

    info = server.ensure(lambda line: err.print(line, soft_wrap=True))
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


@app.command()
def run(
    config: ConfigPath,
    only: Annotated[list[str] | None, typer.Option("--only", help="Run just this stage (repeatable).")] = None,
    start: Annotated[str | None, typer.Option("--from", help="Run from this stage on.")] = None,
    keep_serving: Annotated[bool, typer.Option("--keep-serving", help="Leave the service up at the end.")] = False,
    fresh: Fresh = False,
    no_download: NoDownload = False,
    full_verify: FullVerify = False,
    baseline_run: Annotated[
        str | None, typer.Option("--baseline-run", help="Also judge the figures against this run's (an id or prefix).")
    ] = None,
    runs_dir: RunsDir = None,
) -> None:
    """Run the whole pipeline (validate): preflight → … → launch → smoke → bench → accuracy → teardown."""
    from k3deploy.flows.registry import select
    from k3deploy.flows.run_options import BenchOptions

    try:
        select(only, start)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    cfg = _config(config)
    _set_runs_dir(runs_dir)
    with _prefect() as info, _flow_log() as log, _parsed(_source(config), cfg):
        from k3deploy.cli.output import Progress
        from k3deploy.flows.campaign import LISTENERS
        from k3deploy.flows.validate import validate

        LISTENERS.append(Progress(err))
        state = validate(
            config=_source(config),
            only=tuple(only or ()),
            from_stage=start or "preflight",
            stages=_stage_options(fresh, no_download, full_verify),
            bench=BenchOptions(baseline_run=baseline_run or ""),
            keep_serving=keep_serving,
            return_state=True,
        )
    _print_run(str(state.state_details.flow_run_id), state, info.ui, log)


def _print_run(run_id: str, state: Any, ui: str, log: Path) -> None:
    """The run's stage table, where its record and report are, and exit 1 unless it passed."""
    from k3deploy.cli.output import print_record
    from k3deploy.core.paths import run_folder
    from k3deploy.records.record import RECORD_NAME, read_record

    try:
        record = read_record(run_id)
    except K3DeployError:
        err.print(f"log: {log}")
        state.result()  # no record: the run failed before it could write one; raise why
        raise
    folder = run_folder(run_id).resolve()
    out.print()
    print_record(out, record)
    out.print(f"run record: {folder / RECORD_NAME}")
    out.print(f"log: {_keep_log(log, folder)}")
    if (folder / "report.html").exists():
        out.print(f"report: {folder / 'report.html'}")
    out.print(f"Prefect UI: {ui}/runs/flow-run/{run_id}")
    if record.verdict != "pass":
        raise typer.Exit(1)


@app.command()
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
    teardown_after: Annotated[bool, typer.Option("--teardown-after", help="launch: remove it once ready.")] = False,
    fmt: FormatOption = Format.text,
    runs_dir: RunsDir = None,
) -> None:
    """Retry a finished validate run (the UI's Retry), or with -c run one stage again.

    `k3deploy rerun RUN_ID` runs the same flow run again: the stages that passed with the same inputs are
    not executed again, the failed one and what follows are. `k3deploy rerun -c site.yaml STAGE` runs one
    stage alone; verified work of earlier runs is reused (cached tasks, node manifests).
    """
    _set_runs_dir(runs_dir)
    if config is None:
        _retry(target)
        return
    from k3deploy.flows.registry import stage as find

    try:
        chosen = find(target)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    cfg = _config(config)
    options = _stage_options(fresh, no_download, full_verify).of(chosen)
    if "teardown_after" in chosen.alone:
        options["teardown_after"] = teardown_after
    _run_one(chosen.name, _source(config), cfg, options, fmt)


def _retry(run: str) -> None:
    with _prefect() as info, _flow_log() as log:
        from k3deploy.cli.output import Progress
        from k3deploy.cli.rerun import retry
        from k3deploy.flows.campaign import LISTENERS

        LISTENERS.append(Progress(err))
        state = retry(run, on_state=err.print)
    _print_run(str(state.state_details.flow_run_id), state, info.ui, log)


def _run_one(name: str, source: str, cfg: DeploymentConfig, options: dict[str, Any], fmt: Format) -> None:
    from k3deploy.core.stage import held, now
    from k3deploy.flows.registry import FINAL
    from k3deploy.flows.registry import stage as find

    with _prefect(), _flow_log() as log, _parsed(source, cfg):
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


@app.command()
def bisect(
    run_id: Annotated[str, typer.Argument(help="A REGRESSED or failed run's id (or a unique prefix).")],
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Deployment YAML or saved block whose secrets the experiments use."),
    ] = None,
    good: Annotated[
        str | None, typer.Option("--good", help="The passing run to bisect against (default: the last pass).")
    ] = None,
    max_experiments: Annotated[int, typer.Option("--max-experiments", min=1, help="Stop after this many.")] = 8,
    resume: Annotated[bool, typer.Option("--resume", help="Take up this run's unfinished bisect.")] = False,
    runs_dir: RunsDir = None,
) -> None:
    """Find what broke a run: experiments from launch on, each difference since the last pass varied.

    Prints each experiment as it ends, then the verdict (culprit, interaction, not reproducible, undecided),
    what the bisect spent and saved in cluster time, and where its record is. Exits 1 unless it decided.
    """
    _set_runs_dir(runs_dir)
    source = _source(config) if config else None
    cfg = _config(config) if config else None
    with _prefect() as info, _flow_log() as log:
        from k3deploy.cli.output import Progress
        from k3deploy.flows.bisect import bisect as bisect_flow
        from k3deploy.flows.campaign import LISTENERS

        LISTENERS.append(Progress(err))
        with _parsed(source, cfg) if source and cfg else contextlib.nullcontext():
            state = bisect_flow(
                run=run_id, config=source or "", good_run=good or "", max_experiments=max_experiments, resume=resume,
                return_state=True,
            )  # fmt: skip
    _print_bisect(str(state.state_details.flow_run_id), state, info.ui, log)


def _print_bisect(bisect_id: str, state: Any, ui: str, log: Path) -> None:
    from k3deploy.cli.output import print_bisect
    from k3deploy.core.paths import run_folder
    from k3deploy.records.bisect_record import BISECT_NAME, read_bisect
    from k3deploy.records.bisect_search import BisectVerdict

    record = read_bisect(bisect_id)
    if record is None:
        err.print(f"log: {log}")
        state.result()  # it stopped before its first record: raise why
        raise K3DeployError("the bisect ended without a record")
    folder = run_folder(bisect_id).resolve()
    out.print()
    print_bisect(out, record)
    out.print(f"bisect record: {folder / BISECT_NAME}")
    out.print(f"log: {_keep_log(log, folder)}")
    out.print(f"Prefect UI: {ui}/runs/flow-run/{bisect_id}")
    if not state.is_completed():
        state.result()
    if record.outcome is None or record.outcome.verdict is BisectVerdict.UNDECIDED:
        raise typer.Exit(1)


@app.command()
def tune(
    config: ConfigPath,
    matrix: Annotated[Path, typer.Option("--matrix", "-m", help="The tune matrix YAML (see configs/tune-local.yaml).")],
    resume: Annotated[
        str | None, typer.Option("--resume", help="An earlier tune's id (or prefix): run only its cells not recorded.")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print every cell's settings and plan; run nothing.")
    ] = False,
    runs_dir: RunsDir = None,
) -> None:
    """Server settings × bench workloads and concurrencies: each cell relaunched, proved and measured.

    Prints each cell as it ends (its outcome, or its failure's class and cause), then the cells' table, the
    recommendation, and where the record and the HTML report (the Pareto frontier) are. Exits 1 when no cell passed.
    """
    _set_runs_dir(runs_dir)
    from k3deploy.flows.tune_matrix import TuneMatrix, cell_config, describe, expand

    cfg = _config(config)
    try:
        import yaml

        spec = TuneMatrix.model_validate(yaml.safe_load(matrix.read_text()) or {})
        cells = expand(spec)
        configs = [cell_config(cfg, cell, spec) for cell in cells]
    except OSError as error:
        raise K3DeployError(f"{matrix}: {error.strerror or error}") from None
    except (yaml.YAMLError, ValueError) as error:
        raise K3DeployError(f"{matrix}: {error}") from None
    if dry_run:
        from k3deploy.tasks.render import render_plan

        for cell, cell_cfg in zip(cells, configs, strict=True):
            bench = cell_cfg.bench
            out.print(f"# cell {cell.name}: {describe(cell)}", markup=False, highlight=False)
            out.print(f"# bench: concurrency {[bench.max_concurrency, *bench.concurrency_sweep]}, prefix-hit workload "
                      f"{'on' if bench.prefix_hit else 'off'}", markup=False, highlight=False)  # fmt: skip
            typer.echo(render_plan(cell_cfg).to_text())
        return
    source = _source(config)
    with _prefect() as info, _flow_log() as log:
        from k3deploy.cli.output import Progress
        from k3deploy.flows.campaign import LISTENERS
        from k3deploy.flows.tune import tune as tune_flow

        LISTENERS.append(Progress(err))
        with _parsed(source, cfg):
            state = tune_flow(config=source, matrix=spec, resume=resume or "", return_state=True)
    _print_tune(str(state.state_details.flow_run_id), state, info.ui, log)


def _print_tune(tune_id: str, state: Any, ui: str, log: Path) -> None:
    from k3deploy.cli.output import print_tune
    from k3deploy.core.paths import run_folder
    from k3deploy.flows.tune import TUNE_HTML
    from k3deploy.records.tune_record import TUNE_NAME, read_tune

    record = read_tune(tune_id)
    if record is None:
        err.print(f"log: {log}")
        state.result()  # it stopped before its first record: raise why
        raise K3DeployError("the tune ended without a record")
    folder = run_folder(tune_id).resolve()
    out.print()
    print_tune(out, record)
    out.print(f"tune record: {folder / TUNE_NAME}")
    if (folder / TUNE_HTML).exists():
        out.print(f"report: {folder / TUNE_HTML}")
    out.print(f"log: {_keep_log(log, folder)}")
    out.print(f"Prefect UI: {ui}/runs/flow-run/{tune_id}")
    if not state.is_completed():
        state.result()
    if not any(c.verdict == "pass" for c in record.cells):
        raise typer.Exit(1)


@app.command()
def deploy(
    config: Annotated[
        str, typer.Option("--config", "-c", help="A saved DeploymentConfig block, or a YAML path the workers read.")
    ],
    pool: Annotated[str, typer.Option("--pool", help="The process work pool (created if missing).")] = "k3deploy",
    cron: Annotated[str, typer.Option("--cron", help="When the nightly validate runs.")] = "30 1 * * *",
    timezone: Annotated[str, typer.Option("--timezone", help="The cron's time zone (IANA name).")] = "UTC",
    runs_dir: RunsDir = None,
    per_cluster: Annotated[
        bool,
        typer.Option(
            "--per-cluster",
            help="Name the deployments after the config's cluster (nightly-<cluster>, …): one server, a fleet.",
        ),
    ] = False,
) -> None:
    """Create or update the work pool and the deployments: nightly, validate, stage-<name>, teardown.

    Their runs start in this folder (relative config paths resolve as here) and keep their records in
    this runs store; workers on other hosts need both paths, shared.
    """
    _set_runs_dir(runs_dir)
    source = config
    if source.endswith((".yaml", ".yml")) or "/" in source:
        source = str(Path(source).resolve())
    cfg = _config(Path(source))
    with _prefect() as info:
        from k3deploy.deployments.definitions import apply
        from k3deploy.flows.cluster_lock import cluster_label
        from k3deploy.tasks.transport.sftp_store import shared_store

        cluster = cluster_label(cfg.cluster) if per_cluster else ""
        created = apply(source, pool, cron, timezone, cluster=cluster)
        store = shared_store()
    for name, deployment_id in created.items():
        out.print(f"{name}: {info.ui}/deployments/deployment/{deployment_id}", soft_wrap=True)
    if store is not None:
        out.print(f"shared store {store.where()}: stage results and runs of every worker; each worker keeps its "
                  "own runs folder ($K3DEPLOY_RUNS_DIR)", soft_wrap=True)  # fmt: skip
    from k3deploy.cli.server import client_authenticated

    auth = " PREFECT_API_AUTH_STRING=…" if client_authenticated() else ""
    out.print(f"start a worker: PREFECT_API_URL={info.url}{auth} prefect worker start --pool {pool}", soft_wrap=True)


@app.command()
def teardown(config: ConfigPath, fmt: FormatOption = Format.text) -> None:
    """Stop and remove this config's containers on every node, and prove none is left; safe to repeat."""
    _run_one("teardown", _source(config), _config(config), {}, fmt)


@app.command()
def runs(runs_dir: RunsDir = None) -> None:
    """List the recorded runs, newest first, then one line for each record that cannot be read (exit 0)."""
    from k3deploy.cli.output import runs_table
    from k3deploy.core.paths import runs_dir as store
    from k3deploy.records.record import scan_records

    _set_runs_dir(runs_dir)
    _pull_shared_runs()
    scan = scan_records()
    if scan.records:
        out.print(runs_table(scan.records))
    elif not scan.unreadable:
        out.print(f"no recorded runs in {store()}/")
    for unreadable in scan.unreadable:
        out.print(f"unreadable: {unreadable}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="Run id (or a unique prefix), from `k3deploy runs`.")],
    compare: Annotated[
        bool, typer.Option("--compare", help="Judge its bench and accuracy figures against baselines and history.")
    ] = False,
    last: Annotated[int, typer.Option("--last", help="--compare: how many earlier passing runs to judge by.")] = 10,
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="--compare: also against this run's figures.")
    ] = None,
    fmt: FormatOption = Format.text,
    runs_dir: RunsDir = None,
) -> None:
    """Show a run's record as a summary; --compare gives PASS / REGRESSED / INCONCLUSIVE per figure.

    --compare also writes the run's report.html, report.md and comparison.json again; it exits 1 when a
    figure REGRESSED or is MISSING. A record that cannot be read is one line naming it, exit 1.
    """
    from k3deploy.cli.output import print_comparison, print_record
    from k3deploy.core.paths import runs_dir as store
    from k3deploy.records.record import read_record

    _set_runs_dir(runs_dir)
    _pull_shared_runs()
    record = read_record(run_id)
    if not compare:
        if fmt is Format.json:
            typer.echo(record.model_dump_json(indent=2))
        else:
            print_record(out, record)
        return
    from k3deploy.records.history import RegressionVerdict
    from k3deploy.records.run_report import REPORT_HTML, write_report_files

    comparison, _links, _md = write_report_files(record, store(), last, baseline)
    if fmt is Format.json:
        typer.echo(json.dumps(comparison.as_dict(), indent=2))
    else:
        print_comparison(out, comparison)
        out.print(f"report: {(store() / record.run_id / REPORT_HTML).resolve()}")
    if comparison.verdict in (RegressionVerdict.REGRESSED, RegressionVerdict.MISSING):
        raise typer.Exit(1)


@server_app.command("start")
def server_start(
    host: Annotated[
        str, typer.Option("--host", help="Address to serve on; other than loopback it needs --auth (or --insecure).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port (the next free one if taken).")] = 4200,
    auth: Annotated[
        bool, typer.Option("--auth", help="Basic authentication on the API; its auth string kept in a 0600 file.")
    ] = False,
) -> None:
    """Start k3deploy's Prefect server (every other command starts one on loopback when none runs)."""
    from k3deploy.cli import server

    info = server.recorded()
    if info is not None and auth and info.auth_file is None:
        raise K3DeployError(f"a server without API auth already runs at {info.ui}: `k3deploy server stop` it first")
    if info is None:
        info = server.start(lambda line: out.print(line, soft_wrap=True), host=host, port=port, auth=auth)
    out.print(_server_line(info), soft_wrap=True)


def _server_line(info: ServerInfo) -> str:
    from k3deploy.cli.server import on_loopback

    if info.auth_file:
        guard = f"API auth on (auth string in {info.auth_file})"
    else:
        guard = "no API auth (loopback only)" if on_loopback(info.url) else "no API auth (--insecure)"
    return f"running at {info.ui} (pid {info.pid}); {guard}"


@server_app.command("status")
def server_status() -> None:
    """Say which Prefect server the CLI uses."""
    from k3deploy.cli import server

    info = server.recorded()
    out.print(_server_line(info) if info else "not running; the next command starts it", soft_wrap=True)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server k3deploy started (its runs stay in its database)."""
    from k3deploy.cli import server

    info = server.stop()
    out.print(f"stopped the server at {info.ui}" if info else "no k3deploy Prefect server is running")


@cluster_app.command("status")
def cluster_status(config: ConfigPath, fmt: FormatOption = Format.text) -> None:
    """Say whether the cluster is free, or which run holds it, since when, and whether that run is alive."""
    cluster = _config(config).cluster
    with _prefect():
        from k3deploy.flows.cluster_lock import cluster_hold

        hold = cluster_hold(cluster)
    if fmt is Format.json:
        typer.echo(json.dumps(hold.to_json(), indent=2))
        return
    if not hold.held:
        out.print(f"cluster {hold.label}: free ({hold.lock})")
        return
    record = hold.record
    who = record.describe() if record else "an unknown holder (no record)"
    out.print(f"cluster {hold.label}: held by {who} ({hold.lock})", soft_wrap=True)
    if record is not None:
        age = record.renewed_age_s()
        state = (hold.run_state or "gone").capitalize() if record.run_id else "no flow run (a CLI run)"
        renewed = "never" if age is None else f"{age:.0f} s ago"
        out.print(f"  flow run: {state}; last renewed {renewed}; lease {record.lease_id}", soft_wrap=True)
    dead = hold.dead_reason()
    out.print(f"  stale: {dead}; `k3deploy cluster release` frees it" if dead else "  alive", soft_wrap=True)


@cluster_app.command("release")
def cluster_release(
    config: ConfigPath,
    force: Annotated[bool, typer.Option("--force", help="Release even while the holder looks alive.")] = False,
) -> None:
    """Free a hold whose run is dead (ended, or not renewed for longer than its lease); refuses a live one."""
    cluster = _config(config).cluster
    with _prefect():
        from k3deploy.flows.cluster_lock import release_cluster

        said = release_cluster(cluster, force=force)
    out.print(said, soft_wrap=True)


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
