"""The run report: a Markdown summary and a self-contained HTML page with plots, from a run record.

Pure rendering (no I/O): the page comes from a jinja2 template (k3deploy/templates/report.html.j2) and
carries its CSS and its charts (matplotlib's SVG, k3deploy/records/charts.py) inline, so it opens from a file, an
artifact link or a mail attachment alike, offline. Prefect 3 has no HTML artifact; the page is written
beside the record and linked.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from importlib import resources

import jinja2
from markupsafe import Markup

from k3deploy.records.charts import line_chart
from k3deploy.records.history import BENCH_METRICS, Comparison, bench_cells, figures
from k3deploy.records.load_report import capacity_charts, capacity_rows, drift_rows, soak_charts, soak_rows
from k3deploy.records.record import RunRecord

VERDICT_COLOURS = {
    "pass": "#2ca02c",
    "fail": "#d62728",
    "skipped": "#7f7f7f",
    "not-applicable": "#7f7f7f",
    "inconclusive": "#ff7f0e",
    "PASS": "#2ca02c",
    "REGRESSED": "#d62728",
    "MISSING": "#d62728",
    "INCONCLUSIVE": "#ff7f0e",
}


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def stage_rows(record: RunRecord) -> list[dict[str, str]]:
    return [
        {
            "stage": s.stage,
            "verdict": s.verdict.value,
            "seconds": f"{s.seconds:g}",
            "node-seconds": f"{s.node_seconds:g}"
            + (f" ({s.saved_node_seconds:g} reused)" if s.saved_node_seconds else ""),
            "summary": s.summary or s.reason,
        }
        for s in record.stages
    ]


def bench_rows(record: RunRecord) -> list[dict[str, str]]:
    """One row per bench cell: VALID or INVALID and why, the cache and concurrency it got, median (min–max)."""
    rows = []
    for c in bench_cells(record):
        f, spread = c.get("figures", {}), c.get("spread", {}) if c.get("repeats", 1) > 1 else {}

        def shown(metric: str, f: dict[str, float] = f, spread: dict[str, list[float]] = spread) -> str:
            low_high = spread.get(metric)
            return _fmt(f.get(metric)) + (f" ({low_high[0]:.4g}–{low_high[1]:.4g})" if low_high else "")

        rate = c.get("hit_rate")
        rows.append(
            {
                "workload": c["workload"],
                "concurrency": str(c["concurrency"]),
                "cell": ("VALID" if c["valid"] else "INVALID") + "".join(f"; {r}" for r in c.get("reasons", [])),
                "runs": str(c.get("repeats", 1)),
                "completed": f"{c['completed']}/{c['num_prompts']}",
                "prefix hit rate": "" if rate is None else f"{rate:.1%}",
                "achieved concurrency": _fmt(c.get("achieved_concurrency")),
                "output tok/s": shown("output_throughput"),
                "req/s": shown("request_throughput"),
                "goodput req/s": shown("request_goodput"),
                "mean TTFT ms": shown("mean_ttft_ms"),
                "p99 TTFT ms": shown("p99_ttft_ms"),
                "mean TPOT ms": shown("mean_tpot_ms"),
                "flags": "; ".join(c.get("flags", [])),
            }
        )
    return rows


def accuracy_rows(record: RunRecord) -> list[dict[str, str]]:
    accuracy = record.stage("accuracy")
    return [
        {
            "evaluator": f"{s['evaluator']} {s['version']}",
            "dataset": s["dataset"],
            "metric": s["metric"],
            "score": _fmt(s["score"]),
            "samples": f"{s['completed']} completed, {s['failed']} failed, {s['missing']} missing, "
            f"{s['unparsed']} unparsed" + (f" of {s['dataset_size']}" if "dataset_size" in s else ""),
        }
        for s in (accuracy.data.get("scores", []) if accuracy else [])
    ]


def conformance_rows(record: RunRecord) -> list[dict[str, str]]:
    """One row per conformance rule, mode and load: cases, failures, the limit, the verdict, the first failing cases."""
    stage = record.stage("conformance")
    return [
        {
            "rule": r["rule"],
            "mode": r["mode"] or "pairs",
            "load": r["load"],
            "failed": f"{r['failed']} of {r['cases']}",
            "limit": r["limit"],
            "verdict": "pass" if r["ok"] else "fail",
            "detail": r["detail"][:300],
        }
        for r in (stage.data.get("rules", []) if stage else [])
    ]


def comparison_rows(comparison: Comparison | None) -> list[dict[str, str]]:
    return [
        {
            "figure": m.key,
            "value": "missing" if m.value is None else _fmt(m.value),
            "verdict": m.verdict.value,
            "why": m.reason,
        }
        for m in (comparison.metrics if comparison else [])
    ]


def _md_table(rows: Sequence[dict[str, str]]) -> list[str]:
    if not rows:
        return ["(none)"]
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(r[h].replace("|", "\\|") for h in head) + " |" for r in rows]


def markdown(record: RunRecord, comparison: Comparison | None, links: dict[str, str]) -> str:
    """The run at a glance: verdicts, bench and accuracy tables, the comparison, where everything is."""
    lines = [f"# validate {record.run_name or ''}: {record.verdict.upper()}", ""]
    if record.failed_stage:
        cause = f" — {record.failure.describe()}" if record.failure else ""
        lines += [f"Failed at **{record.failed_stage}**{cause}", ""]
    if comparison is not None:
        lines += [
            f"Regression verdict: **{comparison.verdict.value}** against "
            f"{len(comparison.history_runs)} earlier passing run(s) of this config family.",
            "",
        ]
        lines += [f"The run {comparison.why}.", ""] if comparison.why else []
        lines += [f"- changed since the last pass: {c}" for c in comparison.changes[:20]]
        lines += [f"- left out of the history, unreadable: {u}" for u in comparison.unreadable] + [""]
    lines += ["## Stages", "", *_md_table(stage_rows(record)), "", record.cluster_time() + ".", ""]
    if record.stage("conformance") is not None:
        lines += ["## Conformance", "", *_md_table(conformance_rows(record)), ""]
    lines += ["## Bench", "", *_md_table(bench_rows(record))]
    if record.capacity is not None:
        lines += ["", "## Capacity", "", f"{record.capacity.line}.", "", *_md_table(capacity_rows(record))]
    if record.soak is not None:
        lines += ["", "## Soak", "", _soak_line(record), "", *_md_table(soak_rows(record))]
        lines += ["", *_md_table(drift_rows(record))] if drift_rows(record) else []
    lines += ["", "## Accuracy", "", *_md_table(accuracy_rows(record))]
    if comparison is not None:
        lines += ["", "## Against history and baselines", "", *_md_table(comparison_rows(comparison))]
    lines += ["", "## Files", ""] + [f"- {name}: [{target}]({target})" for name, target in links.items()]
    return "\n".join(lines) + "\n"


def _soak_line(record: RunRecord) -> str:
    s = record.soak
    assert s is not None
    said = f"{s.windows} window(s), {s.minutes:g} of {s.planned_minutes:g} min, {s.requests} requests"
    said += f" ({s.resumed_windows} taken over from an earlier attempt)" if s.resumed_windows else ""
    return said + (f"; drifted: {', '.join(s.drifted)}" if s.drifted else "") + "."


# -- charts and the page -------------------------------------------------------------------------


def concurrency_charts(record: RunRecord) -> list[str]:
    """Throughput and latency against concurrency, one line per workload (with a sweep: two or more)."""
    by_metric: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for fig in figures(record).values():
        if fig.key.startswith("bench "):
            _, workload, conc, metric = fig.key.split(" ")
            by_metric[metric][workload].append((float(conc[1:]), fig.value))
    levels = {x for series in by_metric.get("output_throughput", {}).values() for x, _ in series}
    if len(levels) < 2:
        return []
    charts = []
    for metric, unit in (("output_throughput", "output tokens/s"), ("mean_ttft_ms", "ms"), ("mean_tpot_ms", "ms")):
        if metric in by_metric:
            series = sorted(by_metric[metric].items())
            charts.append(line_chart(f"{metric} against concurrency", series, "max concurrency", unit))
    return charts


def history_charts(record: RunRecord, comparison: Comparison, history: Sequence[RunRecord]) -> list[str]:
    """Each judged figure over the run history (oldest first, this run last) with its band."""
    charts = []
    order = {run_id: i for i, run_id in enumerate(comparison.history_runs)}
    ordered = sorted((r for r in history if r.run_id in order), key=lambda r: order[r.run_id])
    series = [(r.run_id, figures(r)) for r in ordered]  # once per run, not once per metric
    judged = (*BENCH_METRICS, *_accuracy_metrics(record))
    for m in comparison.metrics:
        if m.median is None or m.value is None or m.key.split(" ")[-1] not in judged:
            continue
        values = [(float(i), fig[m.key].value) for i, (_, fig) in enumerate(series) if m.key in fig]
        values.append((float(len(ordered)), m.value))
        ticks = [run_id[:6] for run_id, fig in series if m.key in fig] + ["this run"]
        band = (m.low, m.high) if m.low is not None and m.high is not None else None
        title = f"{m.key.removeprefix('bench ')} ({m.verdict.value})"
        charts.append(line_chart(title, [(m.key.split(" ")[-1], values)], "run", "", band=band, x_ticks=ticks))
    return charts


def _accuracy_metrics(record: RunRecord) -> list[str]:
    accuracy = record.stage("accuracy")
    return [s["metric"] for s in (accuracy.data.get("scores", []) if accuracy else [])]


def _template() -> jinja2.Template:
    text = resources.files("k3deploy").joinpath("templates/report.html.j2").read_text()
    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(text)


def html_page(
    record: RunRecord,
    comparison: Comparison | None,
    history: Sequence[RunRecord],
    links: dict[str, str],
    sections: Sequence[str] = (),
) -> str:
    """The whole report as one HTML document: no script, no external file; `sections` (HTML, a bisect's) last."""
    return _template().render(
        record=record, comparison=comparison, colours=VERDICT_COLOURS, links=links,
        stages=stage_rows(record), bench=bench_rows(record), accuracy=accuracy_rows(record),
        conformance=conformance_rows(record),
        capacity=capacity_rows(record) if record.capacity else [],
        capacity_charts=[Markup(c) for c in capacity_charts(record)],
        soak=soak_rows(record) if record.soak else [], drift=drift_rows(record),
        soak_line=_soak_line(record) if record.soak else "",
        soak_charts=[Markup(c) for c in soak_charts(record)],
        comparison_rows=comparison_rows(comparison),
        concurrency_charts=[Markup(c) for c in concurrency_charts(record)],
        history_charts=[Markup(c) for c in history_charts(record, comparison, history)] if comparison else [],
        sections=[Markup(s) for s in sections],
    ) + "\n"  # fmt: skip
