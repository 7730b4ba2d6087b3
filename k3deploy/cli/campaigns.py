"""`k3deploy bisect` and `k3deploy tune`: searches made of many attempts (experiments, cells), each run through
the campaign engine and shown as it ends."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any

import typer

from k3deploy.cli.common import (
    ConfigPath,
    RunsDir,
    finish,
    flow_log,
    flow_source,
    load,
    out,
    parsed,
    prefect,
    set_runs_dir,
    show_progress,
)
from k3deploy.core.errors import K3DeployError

commands = typer.Typer()


@commands.command()
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
    set_runs_dir(runs_dir)
    source = flow_source(config) if config else None
    cfg = load(config) if config else None
    with prefect() as info, flow_log() as log:
        from k3deploy.flows.bisect import bisect as bisect_flow

        show_progress()
        with parsed(source, cfg) if source and cfg else contextlib.nullcontext():
            state = bisect_flow(
                run=run_id, config=source or "", good_run=good or "", max_experiments=max_experiments, resume=resume,
                return_state=True,
            )  # fmt: skip
    _finish_bisect(str(state.state_details.flow_run_id), state, info.ui, log)


def _finish_bisect(bisect_id: str, state: Any, ui: str, log: Path) -> None:
    from k3deploy.cli.output import print_bisect
    from k3deploy.records.bisect_record import BISECT_NAME, read_bisect
    from k3deploy.records.bisect_search import BisectVerdict

    record = read_bisect(bisect_id)
    outcome = record.outcome if record is not None else None
    decided = outcome is not None and outcome.verdict is not BisectVerdict.UNDECIDED
    finish("bisect", bisect_id, state, ui, log, record, print_bisect,
           [("bisect record", BISECT_NAME)], passed=decided)  # fmt: skip


@commands.command()
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
    set_runs_dir(runs_dir)
    from k3deploy.flows.tune_matrix import TuneMatrix, cell_config, describe, expand

    cfg = load(config)
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
    source = flow_source(config)
    with prefect() as info, flow_log() as log:
        from k3deploy.flows.tune import tune as tune_flow

        show_progress()
        with parsed(source, cfg):
            state = tune_flow(config=source, matrix=spec, resume=resume or "", return_state=True)
    _finish_tune(str(state.state_details.flow_run_id), state, info.ui, log)


def _finish_tune(tune_id: str, state: Any, ui: str, log: Path) -> None:
    from k3deploy.cli.output import print_tune
    from k3deploy.records.tune_record import TUNE_HTML, TUNE_NAME, read_tune

    record = read_tune(tune_id)
    some_passed = record is not None and any(c.verdict == "pass" for c in record.cells)
    finish("tune", tune_id, state, ui, log, record, print_tune,
           [("tune record", TUNE_NAME), ("report", TUNE_HTML)], passed=some_passed)  # fmt: skip
