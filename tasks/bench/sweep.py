"""The bench stage's sweep: every planned cell measured (or resumed from this run's folder), judged and tabled.

Apart from the flow so that it reads like its row of the stage table; `measure` runs inside the
liveness watch (it stops between runs once `stop` is set).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.stage import FailureClass, Finding
from k3deploy.tasks.bench.cells import Cell, Serving, cell, row, summary
from k3deploy.tasks.bench.results import BenchRun, against_baselines
from k3deploy.tasks.bench.steps import planned_runs, reset_prefix_cache, run_bench, saved_run
from k3deploy.tasks.render import Plan, speculative_config


@dataclass
class Sweep:
    """What the sweep gathered so far (kept when the watch stops it half-way, for the stage's record)."""

    runs: list[BenchRun] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def measure(self, cfg: DeploymentConfig, plan: Plan, folder: Path, stop: threading.Event) -> None:
        serving = served(cfg)
        for workload, concurrency in planned_runs(cfg):
            done: list[BenchRun] = []
            resumed = 0
            for repeat in range(1, cfg.bench.repeats + 1):
                found = saved_run(cfg, folder, workload, concurrency, repeat)
                resumed += found is not None
                if found is None:
                    if cfg.bench.reset_prefix_cache and cfg.serve.enable_prefix_caching:
                        reset_prefix_cache(cfg)
                    found = run_bench(cfg, plan, workload, concurrency, folder, stop, repeat)
                done.append(found)
            self.runs.extend(done)
            judged = cell(done, cfg.bench.validity, serving, cfg.bench.baselines)
            self.cells.append(judged)
            subject = f"{workload} c{concurrency}"
            invalid = None if judged.valid else FailureClass.TOOL  # the measurement is not evidence
            self.findings.append(Finding(subject, "valid cell", judged.valid, summary(judged), invalid))
            comparisons = against_baselines(workload, concurrency, judged.figures, cfg.bench.baselines)
            for c in comparisons:
                seen = "missing" if c.value is None else f"{c.value:g}"
                self.findings.append(Finding(subject, f"{c.metric} vs baseline", c.ok, f"{seen} {c.rule}"))
            self.rows.append(row(judged, comparisons, f"{resumed}/{judged.repeats}", done[0].speculative))


def served(cfg: DeploymentConfig) -> Serving:
    """What a cell of this config is judged against: the server's settings and the bench plan's."""
    draft = speculative_config(cfg)
    tokens = (draft or {}).get("num_speculative_tokens")
    reference = cfg.bench.speculative_reference.get(tokens) if tokens else None
    return Serving(cfg.serve.enable_prefix_caching, drafting=draft is not None, num_prompts=cfg.bench.num_prompts,
                   model=cfg.serve.served_model_name,
                   output_len=cfg.bench.random_output_len if cfg.bench.ignore_eos else None,
                   range_ratio=cfg.bench.random_range_ratio, acceptance_reference=reference)  # fmt: skip


def settings(cfg: DeploymentConfig) -> dict[str, Any]:
    """What the figures were measured under: history compares runs of the same settings."""
    return {
        "checkpoint_revision": cfg.models.target.revision,
        "topology": {
            "nodes": len(cfg.cluster.nodes),
            "dp": cfg.serve.data_parallel_size,
            "tp": cfg.serve.tensor_parallel_size,
            "ep": cfg.serve.expert_parallel_size,
        },
        "graph_mode": cfg.serve.compilation_config,
        "prefix_caching": cfg.serve.enable_prefix_caching,
        "input_len": cfg.bench.random_input_len,
        "output_len": cfg.bench.random_output_len,
        "repeats": cfg.bench.repeats,
        "slo": cfg.bench.slo.model_dump(),
        "reset_prefix_cache": cfg.bench.reset_prefix_cache,
        "draft": None if cfg.models.draft is None else cfg.models.draft.repo,
        "speculative": speculative_config(cfg),
    }


def headline(sweep: Sweep) -> str:
    served, first, valid = sum(r.completed for r in sweep.runs), sweep.cells[0], sum(c.valid for c in sweep.cells)
    return (
        f"{valid} of {len(sweep.cells)} cells valid ({len(sweep.runs)} runs, {served} requests); {first.workload} "
        f"c{first.concurrency}: {first.figures['output_throughput']:.0f} output tok/s, mean TTFT "
        f"{first.figures['mean_ttft_ms']:.0f} ms"
    )
