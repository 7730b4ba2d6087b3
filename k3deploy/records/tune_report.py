"""What a tune found, for people: the cells' table, the Pareto frontier and a recommendation with its evidence.

Pure rendering: the frontier is drawn by matplotlib into SVG written into the page (text kept as text, no
scripts, no links out), and the page comes from a jinja2 template (k3deploy/templates/tune.html.j2), so
it is one self-contained file that opens offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import jinja2
from markupsafe import Markup
from matplotlib.axes import Axes

from k3deploy.records.charts import svg
from k3deploy.records.tune_record import TuneCell, TuneRecord

FRONTIER_COLOUR, DOMINATED_COLOUR, REFERENCE_COLOUR = "#1f77b4", "#9e9e9e", "#d62728"
LATENCY_KEYS = ("p99_e2el_ms", "mean_e2el_ms")  # the first the bench recorded


@dataclass(frozen=True)
class Point:
    cell: str
    workload: str
    concurrency: int
    per_node: float  # output tokens/s per node
    latency_ms: float
    latency_key: str
    goodput: float | None
    completed: int
    acceptance: float | None

    @property
    def label(self) -> str:
        return f"{self.cell} c{self.concurrency}" + ("" if self.workload == "random" else f" {self.workload}")


def points(record: TuneRecord) -> list[Point]:
    """Every VALID bench cell of every cell that passed: only complete, well-formed evidence is plotted."""
    out = []
    for cell in record.cells:
        if cell.verdict != "pass":
            continue
        for p in cell.points:
            key = next((k for k in LATENCY_KEYS if k in p.figures), None)
            if not p.valid or key is None or "output_throughput" not in p.figures:
                continue
            out.append(Point(cell.name, p.workload, p.concurrency, p.figures["output_throughput"] / record.nodes,
                             p.figures[key], key, p.figures.get("request_goodput"), p.completed,
                             (p.acceptance or {}).get("acceptance_rate")))  # fmt: skip
    return out


def dominates(a: Point, b: Point) -> bool:
    """a is at least as fast per node and at most as slow, and better in one."""
    return a.per_node >= b.per_node and a.latency_ms <= b.latency_ms and (a.per_node, a.latency_ms) != (
        b.per_node, b.latency_ms)  # fmt: skip


def frontier(found: list[Point]) -> list[Point]:
    """The points no other point of the same workload dominates, by throughput per node."""
    return sorted((p for p in found if not any(dominates(q, p) for q in found if q.workload == p.workload)),
                  key=lambda p: (p.workload, p.latency_ms))  # fmt: skip


def recommendation(record: TuneRecord) -> list[str]:
    """The frontier's fastest point per node, with what it rests on and what is not known of it."""
    found = points(record)
    best = max(frontier(found), key=lambda p: p.per_node, default=None)
    if best is None:
        return ["No recommendation: no cell passed with a VALID bench cell (see the failed cells and why)."]
    cell = next(c for c in record.cells if c.name == best.cell)
    lines = [f"Recommended: **{best.cell}** at concurrency {best.concurrency} ({best.workload}): "
             f"{best.per_node:.4g} output tok/s per node, {best.latency_key} {best.latency_ms:.4g} ms, from "
             f"{best.completed} completed requests, every one of them served."]  # fmt: skip
    unknown = []
    if cell.accuracy is None:
        unknown.append("accuracy was not measured for this cell (matrix accuracy: true measures it)")
    if best.goodput is None:
        unknown.append("goodput was not measured (no bench.slo set)")
    if cell.kv_cache_usage_peak is None:
        unknown.append("the KV cache's fullest point was not read during the bench")
    if record.reference and record.reference != best.cell:
        ref = [p for p in found if p.cell == record.reference and p.workload == best.workload]
        if ref:
            top = max(ref, key=lambda p: p.per_node)
            lines.append(f"Against the reference {record.reference}: {best.per_node / top.per_node:.3g} × its best "
                         f"throughput per node ({top.per_node:.4g}).")  # fmt: skip
    lines += [f"Not known: {u}." for u in unknown]
    return lines


def _cut(text: str, head: int = 120, tail: int = 280) -> str:
    """A long outcome's start (class, node, rank) and its end (the engine's own line ends the evidence)."""
    return text if len(text) <= head + tail + 3 else f"{text[:head]} … {text[-tail:]}"


def cell_rows(record: TuneRecord) -> list[dict[str, str]]:
    rows = []
    for cell in record.cells:
        outcome = (
            cell.verdict.upper() if cell.failure is None else f"FAIL at {cell.failed_stage}: {cell.failure.describe()}"
        )
        base = {"cell": cell.name + (" (reference)" if cell.name == record.reference else ""), "outcome": _cut(outcome)}
        kv = cell.engine.get("kv_tokens")
        extra = {"KV cache tokens": "" if kv is None else str(kv),
                 "KV peak": "" if cell.kv_cache_usage_peak is None else f"{cell.kv_cache_usage_peak:.2%}",
                 "accuracy": _accuracy(cell)}  # fmt: skip
        if not cell.points:
            rows.append(base | {"workload": "", "c": "", "requests": ""} | _figures({}) | extra | {"acceptance": ""})
        for p in cell.points:
            invalid = "" if p.valid else " (INVALID: " + "; ".join(p.reasons) + ")"
            what = {"workload": p.workload + invalid, "c": str(p.concurrency),
                    "requests": f"{p.completed}/{p.num_prompts}, {p.failed} failed"}  # fmt: skip
            rows.append(base | what | _figures(p.figures) | extra | {"acceptance": _acceptance(p.acceptance)})
    return rows


def _figures(f: dict[str, float]) -> dict[str, str]:
    def g(key: str) -> str:
        return f"{f[key]:.4g}" if key in f else ""

    def pair(what: str) -> str:
        return f"{g(f'mean_{what}_ms')} / {g(f'p99_{what}_ms')}" if f"mean_{what}_ms" in f else ""

    return {"out tok/s": g("output_throughput"), "req/s": g("request_throughput"), "goodput": g("request_goodput"),
            "TTFT ms mean/p99": pair("ttft"), "TPOT ms mean/p99": pair("tpot"),
            "E2EL ms mean/p99": pair("e2el")}  # fmt: skip


def _acceptance(spec: dict[str, Any] | None) -> str:
    if not spec:
        return ""
    if spec.get("unreadable"):
        return f"unreadable: {spec['unreadable']}"
    rate, length = spec.get("acceptance_rate"), spec.get("mean_acceptance_length")
    per = spec.get("per_position")
    return (f"{rate:.1%}" if rate is not None else "?") + (f", length {length:.3g}" if length else "") + (
        f", per position {', '.join(f'{v:.0%}' for v in per)}" if per else "")  # fmt: skip


def _accuracy(cell: TuneCell) -> str:
    if cell.accuracy is None:
        return "not measured"
    return "; ".join(f"{s['dataset']} {s['metric']} {s['score']:.4g} ({s['completed']} completed, {s['failed']} "
                     f"failed, {s['missing']} missing)" for s in cell.accuracy) or "no scores"  # fmt: skip


def frontier_svg(record: TuneRecord) -> str | None:
    """Throughput per node against latency, each point labelled; the frontier joined, the rest grey."""
    found = points(record)
    if not found:
        return None
    best = set(map(id, frontier(found)))

    def draw(ax: Axes) -> None:
        for workload in sorted({p.workload for p in found}):
            line = [p for p in frontier(found) if p.workload == workload]
            ax.plot([p.latency_ms for p in line], [p.per_node for p in line], color=FRONTIER_COLOUR, linewidth=2.5,
                    marker="o", markersize=8, label=f"Pareto frontier ({workload})", zorder=2)  # fmt: skip
        rest = [p for p in found if id(p) not in best]
        if rest:
            ax.scatter([p.latency_ms for p in rest], [p.per_node for p in rest], color=DOMINATED_COLOUR, s=40,
                       label="dominated", zorder=1)  # fmt: skip
        refs = [p for p in found if p.cell == record.reference]
        if refs:
            ax.scatter([p.latency_ms for p in refs], [p.per_node for p in refs], facecolors="none",
                       edgecolors=REFERENCE_COLOUR, s=220, linewidths=2, label=f"reference ({record.reference})",
                       zorder=3)  # fmt: skip
        for p in found:
            ax.annotate(p.label, (p.latency_ms, p.per_node), textcoords="offset points", xytext=(6, 6), fontsize=8)
        key = found[0].latency_key
        ax.set_xlabel(f"{key.removesuffix('_ms').replace('_', ' ')} (ms) — lower is better")
        ax.set_ylabel("output tokens/s per node — higher is better")
        ax.set_title("Throughput per node against latency, per server setting and concurrency")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)

    return svg(draw, size=(8.5, 5.2))


def _template() -> jinja2.Template:
    text = resources.files("k3deploy").joinpath("templates/tune.html.j2").read_text()
    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(text)


def tune_html(record: TuneRecord) -> str:
    chart = frontier_svg(record)
    return _template().render(
        record=record, rows=cell_rows(record), recommendation=recommendation(record),
        frontier=Markup(chart) if chart else None,
        points=sorted(frontier(points(record)), key=lambda p: -p.per_node),
    )  # fmt: skip


def tune_markdown(record: TuneRecord) -> str:
    lines = [f"# tune {record.tune_name or record.tune_id}", ""]
    lines += [*recommendation(record), ""]
    rows = cell_rows(record)
    if rows:
        head = list(rows[0])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r[h].replace("|", "/") for h in head) + " |" for r in rows]
    done = "" if record.ended_at else f" — unfinished: `k3deploy tune -c … --matrix … --resume {record.tune_id}`"
    return "\n".join([*lines, "", f"{len(record.cells)} cell(s) recorded{done}."]) + "\n"
