"""The comm stage: vLLM-Ascend's multi-node communication checks on every node and NPU, plus host checks."""

from prefect import flow

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import CommStageFailed
from k3deploy.core.stage import StageResult
from k3deploy.tasks.comm.report import CommReport
from k3deploy.tasks.comm.steps import CommChecksFailed, comm_checks, reach_every_node
from k3deploy.tasks.stage_run import StageRun


@flow(name="comm", persist_result=True)
def comm(config: ConfigSource, fresh: bool = False) -> StageResult:
    """Every NPU healthy and reachable across nodes, TLS and driver consistent; else fail naming node and NPU.

    With no NPUs declared (`cluster.npus_per_node: 0`) only the host checks run; the NPU groups are
    recorded as not applicable, with the reason, in `data["not_applicable"]` and the summary.
    A pass is reused for an hour for the same nodes (a rerun of a later stage); `fresh` runs it anyway.
    Every run connects to every node first, with its pinned host key, whatever is reused.
    """
    cfg = resolve_config(config)
    run = StageRun("comm", CommStageFailed)
    with run.guard():
        reach_every_node(cfg)  # a cached pass may skip the checks, never the host keys
        try:
            report: CommReport = comm_checks.with_options(refresh_cache=fresh)(cfg)
        except CommChecksFailed as err:
            report = err.report
    run.findings = list(report.rows)
    run.data = {
        "summary": report.summary(),
        "phase_seconds": dict(report.phase_seconds),
        "not_applicable": [na.as_dict() for na in report.not_applicable],
    }
    for na in report.not_applicable:
        run.note(f"{na.group} ({', '.join(na.checks)}): not applicable: {na.reason}")
    run.table("checks", report.table_rows(), report.summary())
    if not report.ok:
        run.table("failures", report.table_rows(failures_only=True), report.summary())
        run.failed(report.summary())
    if not report.rows and report.not_applicable:  # nothing could run: the stage itself does not apply
        return run.not_applicable("; ".join(dict.fromkeys(na.reason for na in report.not_applicable)))
    return run.passed(report.summary())
