"""The run report: a Markdown summary and a self-contained HTML page with plots, from a run record.

Pure rendering (no I/O): the HTML carries its CSS and SVG plots inline, so it opens from a file,
an artifact link or a mail attachment alike. Prefect 3 has no HTML artifact; the page is written
beside the record and linked.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence

from k3deploy.history import BENCH_METRICS, Comparison, bench_cells, figures
from k3deploy.record import RunRecord

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
BAND = "#c6dbef"
VERDICT_COLOURS = {
    "pass": "#2ca02c",
    "fail": "#d62728",
    "skipped": "#7f7f7f",
    "not-applicable": "#7f7f7f",
    "PASS": "#2ca02c",
    "REGRESSED": "#d62728",
    "MISSING": "#d62728",
    "INCONCLUSIVE": "#ff7f0e",
}
W, H, PAD = 520, 280, 52


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


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
    lines += ["## Bench", "", *_md_table(bench_rows(record))]
    lines += ["", "## Accuracy", "", *_md_table(accuracy_rows(record))]
    if comparison is not None:
        lines += ["", "## Against history and baselines", "", *_md_table(comparison_rows(comparison))]
    lines += ["", "## Files", ""] + [f"- {name}: [{target}]({target})" for name, target in links.items()]
    return "\n".join(lines) + "\n"


# -- SVG plots -------------------------------------------------------------------------------------


def _padded(lo: float, hi: float) -> tuple[float, float]:
    span = (hi - lo) or abs(hi) or 1.0
    return lo - 0.05 * span, hi + 0.05 * span


def line_chart(
    title: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    x_label: str,
    y_label: str,
    band: tuple[float, float] | None = None,
    x_ticks: Sequence[str] | None = None,
) -> str:
    """An inline SVG line chart; `band` shades the range a value may fall in (the baseline band)."""
    points = [p for _, pts in series for p in pts]
    if not points:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points] + (list(band) if band else [])
    x0, x1 = min(xs), max(xs)
    y0, y1 = _padded(min(ys), max(ys))
    if min(p[1] for p in points) >= 0:
        y0 = max(y0, 0.0)  # throughputs and latencies: no axis below zero
    x1 = x1 if x1 != x0 else x0 + 1

    def px(x: float) -> float:
        return PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD)

    def py(y: float) -> float:
        return H - PAD - (y - y0) / (y1 - y0) * (H - 2 * PAD)

    out = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img" aria-label="{_e(title)}">',
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-weight="bold" font-size="13">{_e(title)}</text>',
    ]
    if band:
        top, bottom = py(band[1]), py(max(band[0], y0))
        out.append(
            f'<rect class="band" x="{PAD}" y="{top:.1f}" width="{W - 2 * PAD}" height="{bottom - top:.1f}" '
            f'fill="{BAND}"><title>baseline band {band[0]:.4g} – {band[1]:.4g}</title></rect>'
        )
    out.append(
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#444"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" stroke="#444"/>'
    )
    for y in (y0, (y0 + y1) / 2, y1):
        out.append(f'<text x="{PAD - 4}" y="{py(y) + 4:.1f}" text-anchor="end" font-size="10">{y:.3g}</text>')
    ticks = x_ticks or [f"{x:g}" for x in sorted(set(xs))]
    for x, label in zip(sorted(set(xs)), ticks, strict=False):
        out.append(f'<text x="{px(x):.1f}" y="{H - PAD + 14}" text-anchor="middle" font-size="10">{_e(label)}</text>')
    out.append(f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle" font-size="11">{_e(x_label)}</text>')
    out.append(
        f'<text x="12" y="{H / 2}" font-size="11" transform="rotate(-90 12 {H / 2})" '
        f'text-anchor="middle">{_e(y_label)}</text>'
    )
    for i, (label, pts) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline class="series" points="{path}" fill="none" stroke="{colour}" stroke-width="2.5"/>')
        out += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{colour}"><title>{_e(label)}: {y:.4g}'
            f"</title></circle>"
            for x, y in pts
        ]
        out.append(f'<text x="{PAD + 8 + 150 * i}" y="36" font-size="11" fill="{colour}">— {_e(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


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


def _html_table(rows: Sequence[dict[str, str]]) -> str:
    if not rows:
        return "<p>(none)</p>"
    head = list(rows[0])
    cells = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = []
    for row in rows:
        tds = []
        for h in head:
            colour = VERDICT_COLOURS.get(row[h]) if h == "verdict" else None
            style = f' style="color:{colour};font-weight:bold"' if colour else ""
            tds.append(f"<td{style}>{_e(row[h])}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><tr>{cells}</tr>{''.join(body)}</table>"


CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1 .v{padding:2px 10px;border-radius:4px;color:#fff}table{border-collapse:collapse;margin:8px 0 18px}
td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:left;vertical-align:top}
th{background:#f2f2f2}.plots{display:flex;flex-wrap:wrap;gap:16px}.plot{border:1px solid #ddd;background:#fff}"""


def html_page(
    record: RunRecord,
    comparison: Comparison | None,
    history: Sequence[RunRecord],
    links: dict[str, str],
    sections: Sequence[str] = (),
) -> str:
    """The whole report as one HTML document: no script, no external file; `sections` (HTML, a bisect's) last."""
    colour = VERDICT_COLOURS[record.verdict]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>k3deploy run {_e(record.run_id)}</title><style>{CSS}</style></head><body>",
        f"<h1>validate {_e(record.run_name or '')} <span class='v' style='background:{colour}'>"
        f"{_e(record.verdict.upper())}</span></h1>",
        f"<p>run {_e(record.run_id)}, started {_e(record.started_at.isoformat(timespec='seconds'))}, "
        f"k3deploy {_e(record.k3deploy_version)}, config {_e(record.config_fingerprint)}</p>",
    ]
    if comparison is not None:
        vc = VERDICT_COLOURS[comparison.verdict.value]
        parts.append(
            f"<p>Regression verdict: <b style='color:{vc}'>{comparison.verdict.value}</b> against "
            f"{len(comparison.history_runs)} earlier passing run(s) of this config family.</p>"
        )
        if comparison.why:
            parts.append(f"<p>The run {_e(comparison.why)}.</p>")
        if comparison.changes:
            items = "".join(f"<li>{_e(c)}</li>" for c in comparison.changes[:30])
            parts.append(f"<p>Changed since the last pass ({_e(comparison.last_pass)}):</p><ul>{items}</ul>")
        if comparison.unreadable:
            items = "".join(f"<li>{_e(u)}</li>" for u in comparison.unreadable)
            parts.append(f"<p>Left out of the history, unreadable:</p><ul>{items}</ul>")
    parts += ["<h2>Stages</h2>", _html_table(stage_rows(record)), f"<p>{_e(record.cluster_time())}.</p>"]
    parts += ["<h2>Bench</h2>", _html_table(bench_rows(record))]
    charts = concurrency_charts(record)
    if charts:
        parts.append("<div class='plots'>" + "".join(charts) + "</div>")
    elif bench_rows(record):
        parts.append("<p>One concurrency: set bench.concurrency_sweep (or the form's sweep) to plot against it.</p>")
    parts += ["<h2>Accuracy</h2>", _html_table(accuracy_rows(record))]
    if comparison is not None:
        parts += ["<h2>Against history and baselines</h2>", _html_table(comparison_rows(comparison))]
        trend = history_charts(record, comparison, history)
        if trend:
            parts.append("<div class='plots'>" + "".join(trend) + "</div>")
    items = "".join(f"<li>{_e(name)}: <a href='{_e(target)}'>{_e(target)}</a></li>" for name, target in links.items())
    parts += [*sections, f"<h2>Files</h2><ul>{items}</ul>", "</body></html>"]
    return "\n".join(parts) + "\n"
