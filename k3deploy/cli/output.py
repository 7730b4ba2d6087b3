"""What the CLI prints for people: stage progress, the stage table, a run's summary."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from k3deploy.core.stage import StageResult, Verdict, failure_lines
from k3deploy.records.bisect_record import BisectRecord, conclusion_lines, experiment_rows, verdict_line
from k3deploy.records.history import Comparison
from k3deploy.records.record import RunRecord
from k3deploy.records.tune_record import TuneRecord

if TYPE_CHECKING:  # the flows (and Prefect) load only when a command runs one
    from k3deploy.flows.campaign import Event

STYLE = {Verdict.PASS: "green", Verdict.FAIL: "bold red", Verdict.SKIPPED: "yellow", Verdict.NOT_APPLICABLE: "dim",
         Verdict.INCONCLUSIVE: "bold magenta"}  # fmt: skip


def verdict_text(verdict: Verdict) -> str:
    return f"[{STYLE[verdict]}]{verdict.value}[/]"


class Progress:
    """The campaign engine's listener (flows/campaign.py): a line when a stage, an experiment or a cell starts, and
    one when it ends (a stage's with its failures)."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, event: Event) -> None:
        if event.kind == "progress":  # a capacity probe, a soak window: the window, the time left, its figures
            self.console.print(f"  · {event.outcome}", markup=False, highlight=False)
        elif event.kind != "stage":
            mark = "■■" if event.ended else "▶▶"
            said = f": {event.outcome}" if event.ended else ""
            self.console.print(f"[bold]{mark} {event.kind} {event.name}[/]{said}", highlight=False)
        elif event.result is None:
            self.console.print(f"[bold]▶ {event.name}[/] …")
        else:
            result = event.result
            figure = result.summary or result.reason
            self.console.print(
                f"[bold]■ {event.name}[/] {verdict_text(result.verdict)} in {result.seconds:.1f} s  {figure}"
            )
            for line in failure_lines(result.findings, limit=10):
                self.console.print(f"    {line}", markup=False, highlight=False)


def print_tune(console: Console, record: TuneRecord) -> None:
    """Each cell's outcome and figures, then the recommendation with its evidence."""
    from k3deploy.records.tune_report import cell_rows, recommendation

    table = Table(title=f"tune {record.tune_name or record.tune_id}: {len(record.cells)} cell(s)", title_justify="left")
    keep = ("cell", "outcome", "workload", "c", "requests", "out tok/s", "E2EL ms mean/p99", "KV peak", "acceptance")
    for column in keep:
        table.add_column(column, overflow="fold")
    for row in cell_rows(record):
        table.add_row(*(row[k] for k in keep))
    console.print(table)
    for line in recommendation(record):
        console.print(line.replace("**", ""), markup=False, highlight=False)


def print_bisect(console: Console, record: BisectRecord) -> None:
    """The suspects, each experiment, the verdict and what the search cost."""
    console.print(f"bisect of run {record.bad_run} against its last pass {record.good_run}", highlight=False)
    console.print(f"judged on: {record.target.describe()}", markup=False, highlight=False)
    for suspect in record.suspects:
        console.print(f"  suspect {suspect.name}: {suspect.describe()}", markup=False, highlight=False)
    for fixed in record.fixed:
        console.print(f"  cannot vary: {fixed}", markup=False, highlight=False)
    table = Table(title="experiments", title_justify="left")
    for column in ("experiment", "verdict", "evidence", "reused", "node·s"):
        table.add_column(column, overflow="fold")
    for row in experiment_rows(record):
        table.add_row(*row.values())
    console.print(table)
    console.print(f"verdict: {verdict_line(record)}", markup=False, highlight=False)
    for line in conclusion_lines(record):
        console.print(line, markup=False, highlight=False)
    console.print(record.spend(), markup=False, highlight=False)


def stage_table(stages: list[StageResult], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("stage", "verdict", "time", "node·s", "key figure"):
        table.add_column(column, overflow="fold")
    for s in stages:
        spent = f"{s.node_seconds:.0f}" + (f" ({s.saved_node_seconds:.0f} reused)" if s.saved_node_seconds else "")
        table.add_row(s.stage, verdict_text(s.verdict), f"{s.seconds:.1f} s", spent, s.summary or s.reason)
    return table


def print_stage_result(console: Console, result: StageResult) -> None:
    console.print(stage_table([result]))
    if result.reason and result.reason != result.summary:
        console.print(result.reason, markup=False, highlight=False)
    for line in failure_lines(result.findings):
        console.print(f"  {line}", markup=False, highlight=False)
    if result.artifacts:
        console.print(f"artifacts: {', '.join(result.artifacts)}")


def runs_table(records: list[RunRecord]) -> Table:
    table = Table()
    for column in ("run", "started (UTC)", "verdict", "failed stage", "time", "config"):
        table.add_column(column)
    for r in records:
        seconds = (r.ended_at - r.started_at).total_seconds()
        verdict = Verdict(r.verdict)
        started = r.started_at.strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(
            r.run_id, started, verdict_text(verdict), r.failed_stage or "-", f"{seconds:.0f} s", r.config_fingerprint
        )
    return table


def campaigns_table(bisects: list[BisectRecord], tunes: list[TuneRecord]) -> Table:
    """The bisects and tunes of the runs store (every worker's, with a shared store), newest first, by kind."""
    table = Table(title="bisects and tunes", title_justify="left")
    for column in ("kind", "id", "started (UTC)", "outcome", "of"):
        table.add_column(column)
    rows = [(b.started_at, "bisect", b.bisect_id, b.outcome.verdict.value if b.outcome else "unfinished",
             f"run {b.bad_run}") for b in bisects]  # fmt: skip
    for t in tunes:
        passed = f"{sum(c.verdict == 'pass' for c in t.cells)}/{len(t.cells)} cells passed"
        rows.append((t.started_at, "tune", t.tune_id, passed + ("" if t.ended_at else ", unfinished"),
                     f"config {t.config_fingerprint}"))  # fmt: skip
    for started, kind, ident, outcome, of in sorted(rows, key=lambda r: r[0], reverse=True):
        table.add_row(kind, ident, started.strftime("%Y-%m-%d %H:%M:%S"), outcome, of)
    return table


def print_record(console: Console, record: RunRecord) -> None:
    """A run's record as a readable summary."""
    seconds = (record.ended_at - record.started_at).total_seconds()
    console.print(
        f"run [bold]{record.run_id}[/] ({record.run_name or '-'}): {verdict_text(Verdict(record.verdict))}"
        f" in {seconds:.0f} s, started {record.started_at:%Y-%m-%d %H:%M:%S} UTC, k3deploy {record.k3deploy_version}"
    )
    console.print(f"config {record.config_fingerprint}: {len(record.config['cluster']['nodes'])} nodes")
    console.print(stage_table(record.stages))
    console.print(record.cluster_time())
    if record.failure is not None:
        console.print(f"failed at {record.failed_stage}: {record.failure.describe()}", markup=False, highlight=False)
    for stage in record.stages:
        for line in failure_lines(stage.findings, limit=10):
            console.print(f"  {stage.stage}: {line}", markup=False, highlight=False)
    for c in record.checkpoints:
        console.print(f"{c.role}: {c.repo} commit {c.commit}, {c.files} files, {c.bytes / 1e9:.2f} GB at {c.path}")
    if record.image:
        versions = ", ".join(f"{k} {v}" for k, v in record.image.versions.items())
        console.print(
            f"image: {record.image.ref} id {record.image.image_id[:19]} digest {record.image.digest}; {versions}"
        )
    preflight = record.stage("preflight")
    rows: list[dict[str, str]] = preflight.data.get("table", []) if preflight else []
    for row in rows:  # one line per node: the cells of preflight's node × fact table
        facts = "; ".join(f"{fact} {cell}" for fact, cell in row.items() if fact not in ("node", "ssh"))
        console.print(f"{row['node']}: {facts}", markup=False, highlight=False)
    for node, key in record.host_keys.items():
        console.print(f"host key {node}: {key}")


COMPARISON_STYLES = {"PASS": "green", "REGRESSED": "bold red", "MISSING": "bold red", "INCONCLUSIVE": "yellow"}


def print_comparison(console: Console, comparison: Comparison) -> None:
    """The regression verdict, one row per figure, and what changed since the last pass."""
    style = COMPARISON_STYLES[comparison.verdict.value]
    console.print(
        f"run {comparison.run_id}: [{style}]{comparison.verdict.value}[/] against "
        f"{len(comparison.history_runs)} earlier passing run(s) of config family {comparison.family}"
    )
    if comparison.why:
        console.print(f"  {comparison.why}", markup=False, highlight=False)
    table = Table("figure", "value", "verdict", "why")
    for m in comparison.metrics:
        value = "missing" if m.value is None else f"{m.value:.4g}"
        table.add_row(m.key, value, f"[{COMPARISON_STYLES[m.verdict.value]}]{m.verdict.value}[/]", m.reason)
    console.print(table)
    for unreadable in comparison.unreadable:
        console.print(
            f"left out of the history, unreadable: {unreadable}", markup=False, highlight=False, soft_wrap=True
        )
    if comparison.changes:
        console.print(f"changed since the last pass ({comparison.last_pass}):")
        for change in comparison.changes:
            console.print(f"  {change}", markup=False, highlight=False)
