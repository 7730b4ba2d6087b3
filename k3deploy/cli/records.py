"""`k3deploy runs` and `k3deploy report`: reading the runs store (this disk's, and the fleet's shared one)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from k3deploy.cli.common import Format, FormatOption, RunsDir, out, pull_shared_runs, set_runs_dir

commands = typer.Typer()


@commands.command()
def runs(runs_dir: RunsDir = None) -> None:
    """List the recorded runs, newest first, then the bisects and tunes (by kind), then one line for each record
    that cannot be read (exit 0)."""
    from k3deploy.cli.output import campaigns_table, runs_table
    from k3deploy.core.paths import runs_dir as store
    from k3deploy.records.bisect_record import all_bisects
    from k3deploy.records.record import scan_records
    from k3deploy.records.tune_record import all_tunes

    set_runs_dir(runs_dir)
    pull_shared_runs()
    scan = scan_records()
    bisects, tunes = all_bisects(), all_tunes()
    if scan.records:
        out.print(runs_table(scan.records))
    elif not scan.unreadable:
        out.print(f"no recorded runs in {store()}/")
    if bisects or tunes:
        out.print(campaigns_table(bisects, tunes))
    for unreadable in scan.unreadable:
        out.print(f"unreadable: {unreadable}", markup=False, highlight=False, soft_wrap=True)


@commands.command()
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

    set_runs_dir(runs_dir)
    pull_shared_runs()
    if not compare and _campaign(run_id, fmt):
        return
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


def _campaign(ident: str, fmt: Format) -> bool:
    """A bisect's or a tune's record shown by `report ID` (from any host, with a shared store); False: not one."""
    from k3deploy.cli.output import print_bisect, print_tune
    from k3deploy.records.bisect_record import read_bisect
    from k3deploy.records.tune_record import read_tune

    bisect = read_bisect(ident)
    tune = read_tune(ident) if bisect is None else None
    if fmt is Format.json and (bisect or tune):
        typer.echo((bisect or tune).model_dump_json(indent=2))  # type: ignore[union-attr]
    elif bisect is not None:
        out.print(f"bisect {bisect.bisect_id}", highlight=False)
        print_bisect(out, bisect)
    elif tune is not None:
        out.print(f"tune {tune.tune_id}", highlight=False)
        print_tune(out, tune)
    return bool(bisect or tune)
