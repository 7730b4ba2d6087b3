"""The report of a run, written beside its record and published: Markdown artifact, HTML file, link.

The comparison reads the runs store (`$K3DEPLOY_RUNS_DIR`). With a shared store on the server (a fleet's
workers on several hosts), the records and reports of every worker's runs are brought in first and this
run's folder is sent there after, so history, `k3deploy runs` and `report --compare` see every run.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.store import RUNS, StoreError
from k3deploy.core.errors import K3DeployError
from k3deploy.core.paths import runs_dir
from k3deploy.records.bisect_record import BISECT_NAME, BisectRecord, bisect_html, bisects_of
from k3deploy.records.history import Comparison, RegressionVerdict, compare
from k3deploy.records.record import RECORD_NAME, RunRecord, read_record, scan_records, write_record
from k3deploy.records.report import html_page, markdown
from k3deploy.records.tune_record import TUNE_HTML, TUNE_MD, TUNE_NAME
from k3deploy.tasks.transport.sftp_store import pull_files, push_folder, shared_store, unpushed_runs

HISTORY_RUNS = 10
REPORT_HTML, REPORT_MD, COMPARISON = "report.html", "report.md", "comparison.json"
# What other hosts read of a run, a bisect or a tune (their folders are sent whole)
SHARED_FILES = (RECORD_NAME, REPORT_MD, REPORT_HTML, COMPARISON, BISECT_NAME, TUNE_NAME, TUNE_MD, TUNE_HTML)


def pull_shared_runs() -> str | None:
    """Other workers' records and reports from the server's shared store into the runs store; None: no store."""
    store = shared_store()
    if store is None:
        return None
    fetched = pull_files(store, RUNS, SHARED_FILES, runs_dir())
    return f"{len(fetched)} new or newer files from the shared store {store.where()}"


def push_shared_run(run_id: str) -> str | None:
    """This run's folder (record, reports, logs) into the shared store, and the folders of this host's runs made
    while the store was away; None: no store."""
    store = shared_store()
    if store is None:
        return None
    sent = push_folder(store, runs_dir() / run_id, f"{RUNS}/{run_id}")
    late = [r for r in unpushed_runs(store, runs_dir(), RUNS) if r != run_id]
    for other in late:
        sent += push_folder(store, runs_dir() / other, f"{RUNS}/{other}")
    also = f" and {len(late)} earlier run(s) it did not have ({', '.join(late)})" if late else ""
    return f"{sent} files of run {run_id}{also} to the shared store {store.where()}"


def render_report(
    record: RunRecord, root: Path, last: int = HISTORY_RUNS, baseline_run: str | None = None,
    partial: str | None = None,
) -> tuple[Comparison, dict[str, str], str, str]:  # fmt: skip
    """The comparison with history (and a baseline run), the links, the Markdown and the HTML. With `partial` (why
    the fleet's history could not be read), figures that held are INCONCLUSIVE, never PASS, and say why."""
    scan = scan_records(root)
    candidates = scan.records
    baseline = read_record(baseline_run, root) if baseline_run else None
    comparison = compare(record, candidates, last, baseline, [str(u) for u in scan.unreadable])
    if partial and comparison.verdict in (RegressionVerdict.PASS, RegressionVerdict.INCONCLUSIVE):
        why = "; ".join(w for w in (f"history incomplete: {partial}", comparison.why) if w)
        comparison = replace(comparison, verdict=RegressionVerdict.INCONCLUSIVE, why=why)
    folder = (root / record.run_id).resolve()
    links = {
        "HTML report": (folder / REPORT_HTML).as_uri(),
        "run record": (folder / RECORD_NAME).as_uri(),
        "logs": (folder / "logs").as_uri(),
        "comparison": (folder / COMPARISON).as_uri(),
    }
    history = [r for r in candidates if r.run_id in comparison.history_runs]
    sections = [bisect_html(b) for b in bisects_of(record.run_id, root)]
    page = html_page(record, comparison, history, links, sections)
    return comparison, links, markdown(record, comparison, links), page


def write_report_files(
    record: RunRecord, root: Path, last: int = HISTORY_RUNS, baseline_run: str | None = None,
    partial: str | None = None,
) -> tuple[Comparison, dict[str, str], str]:  # fmt: skip
    """report.html, report.md and comparison.json in the run's folder."""
    comparison, links, md, page = render_report(record, root, last, baseline_run, partial)
    folder = root / record.run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / REPORT_HTML).write_text(page)
    (folder / REPORT_MD).write_text(md)
    (folder / COMPARISON).write_text(json.dumps(comparison.as_dict(), indent=1) + "\n")
    return comparison, links, md


def share(folder: str, logger: Any) -> None:
    """A run's, bisect's or tune's folder into the shared store, if the server has one; a store that cannot be
    reached is a warning (the next run that reaches it sends the folder), never the run's failure."""
    try:
        pushed = push_shared_run(folder)
    except StoreError as err:
        logger.warning("%s is on this worker only, not in the shared store: %s (the next run that reaches it sends "
                       "it)", folder, err)  # fmt: skip
        return
    if pushed:
        logger.info("runs store: %s", pushed)


@task(name="write report", cache_policy=NO_CACHE)
def write_report(record: RunRecord, baseline_run: str | None = None) -> dict[str, str]:
    """Compare with the history, write the report files, publish the Markdown and a link to the HTML."""
    logger = get_run_logger()
    partial = None
    try:
        pulled = pull_shared_runs()
    except StoreError as err:  # the history is this worker's only: never a PASS on it
        partial = f"the shared store is unreachable ({err}): judged on this worker's runs only"
        pulled = None
        logger.warning("history incomplete: %s", partial)
    if pulled:
        logger.info("runs store: %s", pulled)
    try:
        comparison, links, md = write_report_files(record, runs_dir(), HISTORY_RUNS, baseline_run, partial)
    except K3DeployError as err:  # e.g. an unknown baseline run: the report says so, the run stands
        logger.warning("report without the baseline run: %s", err)
        comparison, links, md = write_report_files(record, runs_dir(), HISTORY_RUNS, None, partial)
    create_markdown_artifact(md, key="validate-report", description=f"run {record.run_id}: {record.verdict}")
    create_link_artifact(
        links["HTML report"], link_text=f"report of run {record.run_name or record.run_id}", key="validate-report-html"
    )
    logger.info("regression verdict %s over %d earlier runs", comparison.verdict.value, len(comparison.history_runs))
    for unreadable in comparison.unreadable:
        logger.warning("history leaves out an unreadable record: %s", unreadable)
    share(record.run_id, logger)
    return {"report": links["HTML report"], "comparison": comparison.verdict.value}


@task(name="write run record", cache_policy=NO_CACHE)
def record_run(record: RunRecord) -> str:
    """The record written whole, and its stages as the run's table artifact."""
    path = write_record(record)
    rows = [
        {"stage": s.stage, "verdict": s.verdict.value, "seconds": s.seconds, "summary": s.summary or s.reason}
        for s in record.stages
    ]
    create_table_artifact(rows, key="validate-stages", description=f"run {record.run_id}: {record.verdict}")
    return str(path)


def judged(record: RunRecord, root: Path | None = None) -> RegressionVerdict | None:
    """The regression verdict the run's report gave (its comparison.json), None without a readable one."""
    try:
        return RegressionVerdict(json.loads(((root or runs_dir()) / record.run_id / COMPARISON).read_text())["verdict"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def regressed_keys(record: RunRecord, root: Path | None = None) -> list[str]:
    """The figures the run's report judged REGRESSED (its comparison.json), else judged again from the store."""
    base = root or runs_dir()
    path = base / record.run_id / COMPARISON
    try:
        metrics = json.loads(path.read_text())["metrics"]
        return [m["key"] for m in metrics if m["verdict"] == RegressionVerdict.REGRESSED.value]
    except (OSError, ValueError, KeyError, TypeError):
        scan = scan_records(base)
        comparison = compare(record, scan.records, HISTORY_RUNS)
        return [m.key for m in comparison.metrics if m.verdict is RegressionVerdict.REGRESSED]


def add_to_report(run_id: str, bisect: BisectRecord, root: Path | None = None) -> str | None:
    """The bisect's section in the bad run's HTML report, replacing an earlier one of the same bisect."""
    path = (root or runs_dir()) / run_id / REPORT_HTML
    try:
        page = path.read_text()
    except OSError:
        return None
    section = bisect_html(bisect)
    start = page.find(f"<section id='bisect-{bisect.bisect_id}'>")
    if start >= 0:
        end = page.index("</section>", start) + len("</section>")
        page = page[:start] + section + page[end:]
    else:
        at = page.find("<h2>Files</h2>")
        at = at if at >= 0 else page.rfind("</body>")
        page = page[:at] + section + "\n" + page[at:]
    path.write_text(page)
    return path.resolve().as_uri()
