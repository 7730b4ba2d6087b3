"""The report's sections of the long-load stages: the capacity search's probes and charts (latency and goodput
against concurrency, the SLO lines and the answer marked), the soak's windows and time series (latency
percentiles, throughput and each rank's memory per window, the failing window marked). Pure rendering from a run
record, as report.py."""

from __future__ import annotations

from typing import Any

from k3deploy.records.charts import line_chart
from k3deploy.records.record import RunRecord


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def capacity_rows(record: RunRecord) -> list[dict[str, str]]:
    """One row per probe, in the order run: its outcome, the SLO figures, why."""
    stage = record.stage("capacity")
    probes = stage.data.get("probes", []) if stage else []
    figures = record.capacity
    out = []
    for p in probes:
        mark = ("answer" if figures and p["concurrency"] == figures.below else
                "above" if figures and p["concurrency"] == figures.above else "")  # fmt: skip
        shown = {k: _fmt(v) for k, v in p.get("figures", {}).items() if k != "output_throughput"}
        out.append(
            {
                "concurrency": str(p["concurrency"]),
                "outcome": p["outcome"],
                "mark": mark or "-",
                **shown,
                "why": (p["why"] + (f"; saturated: {p['saturated']}" if p.get("saturated") else ""))[:300],
            }
        )
    return out


def capacity_charts(record: RunRecord) -> list[str]:
    """The SLO's latency percentiles and the goodput fraction against concurrency, with the SLO lines and the
    answer marked."""
    stage = record.stage("capacity")
    if stage is None or not stage.data.get("probes") or record.capacity is None:
        return []
    probes, slo = stage.data["probes"], stage.data.get("slo", {})
    pct = f"p{slo.get('percentile', 99):g}"
    marks = [(f"holds {record.capacity.concurrency}", float(record.capacity.concurrency))]
    marks = marks if record.capacity.concurrency else []
    latency, limits = [], []
    for metric, name in (("ttft", "TTFT"), ("tpot", "TPOT")):
        key = f"{pct}_{metric}_ms"
        points = [(float(p["concurrency"]), p["figures"][key]) for p in probes if key in p.get("figures", {})]
        if points:
            latency.append((f"{pct} {name}", points))
        if slo.get(f"{metric}_ms") is not None:
            limits.append((f"SLO {pct} {name} {slo[f'{metric}_ms']:g} ms", float(slo[f"{metric}_ms"])))
    goodput = [(float(p["concurrency"]), p["figures"]["goodput_fraction"] * 100) for p in probes
               if "goodput_fraction" in p.get("figures", {})]  # fmt: skip
    charts = [line_chart("latency against concurrency", latency, "concurrency", "ms", limits=limits, marks=marks)]
    if goodput:
        floor = [(f"SLO goodput {slo.get('goodput', 0) * 100:g} %", slo.get("goodput", 0) * 100)]
        charts.append(line_chart("goodput against concurrency", [("goodput %", goodput)], "concurrency", "% of "
                                 "requests", limits=floor, marks=marks))  # fmt: skip
    return [c for c in charts if c]


def soak_rows(record: RunRecord) -> list[dict[str, str]]:
    """One row per window, then one per drift check."""
    stage = record.stage("soak")
    if stage is None:
        return []
    rows = []
    for w in stage.data.get("windows", []):
        f = w.get("figures", {})
        rows.append({"window": str(w["index"]), "requests": f"{w['completed']}/{w['num_prompts']}",
                     "seconds": _fmt(w["seconds"]), "tok/s": _fmt(f.get("output_throughput")),
                     "p50 TTFT ms": _fmt(f.get("median_ttft_ms")), "p99 TTFT ms": _fmt(f.get("p99_ttft_ms")),
                     "p50 TPOT ms": _fmt(f.get("median_tpot_ms")), "p50 E2EL ms": _fmt(f.get("median_e2el_ms")),
                     "memory MiB": ", ".join(f"{rank}: {m['bytes'] / 2**20:.0f}" for rank, m in w["memory"].items()
                                             if m.get("bytes") is not None) or "-",
                     "verdict": "pass" if w["valid"] else "fail",
                     "why": ("resumed; " if w.get("resumed") else "") + ("; ".join(w["reasons"]) or "-")})  # fmt: skip
    return rows


def drift_rows(record: RunRecord) -> list[dict[str, str]]:
    stage = record.stage("soak")
    return [{"check": r["check"], "subject": r["subject"], "verdict": "pass" if r["ok"] else "fail",
             "detail": r["detail"]} for r in (stage.data.get("drift", []) if stage else [])]  # fmt: skip


def soak_charts(record: RunRecord) -> list[str]:
    """Per window: latency percentiles, output throughput, each rank's memory; the window that failed marked."""
    stage = record.stage("soak")
    windows = stage.data.get("windows", []) if stage else []
    if not windows:
        return []
    lost = stage.data.get("lost_in_window") if stage else None
    failed = [float(w["index"]) for w in windows if not w["valid"]] + ([float(lost)] if lost else [])
    marks = [(f"failed in window {failed[0]:g}", failed[0])] if failed else []

    def series(key: str) -> list[tuple[float, float]]:
        return [(float(w["index"]), w["figures"][key]) for w in windows if key in w.get("figures", {})]

    latency = [(label, series(key)) for key, label in (("median_ttft_ms", "p50 TTFT"), ("p99_ttft_ms", "p99 TTFT"),
                                                       ("median_e2el_ms", "p50 E2EL")) if series(key)]  # fmt: skip
    ranks = sorted({rank for w in windows for rank in w.get("memory", {})})
    memory = [(rank, [(float(w["index"]), w["memory"][rank]["bytes"] / 2**20) for w in windows
                      if w.get("memory", {}).get(rank, {}).get("bytes") is not None]) for rank in ranks]  # fmt: skip
    charts = [
        line_chart("latency per window", latency, "window", "ms", marks=marks),
        line_chart("output throughput per window", [("tok/s", series("output_throughput"))], "window", "tokens/s",
                   marks=marks),
        line_chart("memory per rank", [(r, pts) for r, pts in memory if pts], "window", "MiB", marks=marks),
    ]  # fmt: skip
    return [c for c in charts if c]
