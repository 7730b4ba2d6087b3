"""Charts for the reports, drawn by matplotlib as SVG written into the page (axes, ticks, legends for free).

Text stays text (searchable, and what a browser test reads), ids are repeatable, and nothing links out: the
pages stay one self-contained file that opens offline. Figures are built without pyplot (no global state,
safe in a flow's threads).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.figure import Figure

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
BAND = "#c6dbef"
SVG_SETTINGS: dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": "k3deploy", "font.size": 9}


def svg(draw: Callable[[Axes], None], size: tuple[float, float] = (6.0, 3.4)) -> str:
    """`draw` on the axes of a new figure, as an inline <svg> element."""
    with rc_context(SVG_SETTINGS):  # type: ignore[arg-type]  # matplotlib types the keys as a Literal
        fig = Figure(figsize=size)
        draw(fig.subplots())
        fig.tight_layout()
        out = io.StringIO()
        fig.savefig(out, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format", "Type")))
    text = out.getvalue()
    return text[text.index("<svg") :]


def line_chart(
    title: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    x_label: str,
    y_label: str,
    band: tuple[float, float] | None = None,
    x_ticks: Sequence[str] | None = None,
    limits: Sequence[tuple[str, float]] = (),
    marks: Sequence[tuple[str, float]] = (),
) -> str:
    """Lines with their points; `band` shades the range a value may fall in (the baseline band); `limits` are
    dashed horizontal lines (an SLO), `marks` dotted vertical ones (an answer, a failing window); '' without
    points."""
    points = [p for _, pts in series for p in pts]
    if not points:
        return ""

    def draw(ax: Axes) -> None:
        if band:
            ax.axhspan(band[0], band[1], color=BAND, label=f"baseline band {band[0]:.4g} – {band[1]:.4g}", zorder=0)
        for i, (label, pts) in enumerate(series):
            ordered = sorted(pts)
            ax.plot([x for x, _ in ordered], [y for _, y in ordered], color=COLOURS[i % len(COLOURS)],
                    linewidth=2.5, marker="o", markersize=5, label=label, zorder=2)  # fmt: skip
        for i, (label, y) in enumerate(limits):
            ax.axhline(y, color=COLOURS[i % len(COLOURS)], linestyle="--", linewidth=1.2, label=label, zorder=1)
        for label, x in marks:
            ax.axvline(x, color="#333333", linestyle=":", linewidth=1.5, label=label, zorder=1)
        xs = sorted({x for x, _ in points})
        ax.set_xticks(xs, list(x_ticks) if x_ticks else [f"{x:g}" for x in xs])
        if min(y for _, y in points) >= 0:
            ax.set_ylim(bottom=0)  # throughputs and latencies: no axis below zero
        ax.set_title(title, fontweight="bold")
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize=8)

    return svg(draw)
