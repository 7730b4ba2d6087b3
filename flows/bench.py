"""The bench stage: `vllm bench serve` (seed section 8) for the cold and prefix-hit workloads, at each concurrency.

Each cell (workload × concurrency) runs `bench.repeats` times and is VALID only when every request
succeeded, the prefix cache was as the workload means it (from /metrics around each run) and the
concurrency asked for was reached (tasks/bench/cells.py); its figures are medians with their spread,
compared with their baselines. Runs already measured in this run's folder are not repeated (a sweep
or a Retry resumes). The runs go on under a watch of every rank: one that dies, logs a fatal line or
gets stuck stops the tool and fails the stage within seconds, naming node and DP rank
(tasks/launch/liveness.py).
"""

import threading
from dataclasses import asdict
from typing import Any

from prefect import flow, runtime

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.errors import BenchStageFailed
from k3deploy.paths import run_folder
from k3deploy.stage import FailureClass, Finding, StageResult
from k3deploy.tasks.bench.cells import Cell, Serving, cell, row, summary
from k3deploy.tasks.bench.results import BenchRun, compare
from k3deploy.tasks.bench.steps import planned_runs, reset_prefix_cache, run_bench, saved_run
from k3deploy.tasks.launch.liveness import watching
from k3deploy.tasks.render import render_plan
from k3deploy.tasks.stage_run import StageRun


@flow(name="bench")
def bench(config: ConfigSource) -> StageResult:
    """Each planned run passes when all its requests completed and its figures meet their baselines."""
    cfg = resolve_config(config)
    run = StageRun("bench", BenchStageFailed)
    folder = run_folder(str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id), "bench")
    plan = render_plan(cfg)
    rows: list[dict[str, Any]] = []
    runs: list[BenchRun] = []
    cells: list[Cell] = []
    serving = Serving(cfg.serve.enable_prefix_caching, drafting=cfg.models.draft is not None)

    def measure(stop: threading.Event) -> None:
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
            runs.extend(done)
            judged = cell(done, cfg.bench.validity, serving, cfg.bench.baselines)
            cells.append(judged)
            subject = f"{workload} c{concurrency}"
            invalid = None if judged.valid else FailureClass.TOOL  # the measurement is not evidence
            run.findings.append(Finding(subject, "valid cell", judged.valid, summary(judged), invalid))
            comparisons = compare(workload, concurrency, judged.figures, cfg.bench.baselines)
            for c in comparisons:
                seen = "missing" if c.value is None else f"{c.value:g}"
                run.findings.append(Finding(subject, f"{c.metric} vs baseline", c.ok, f"{seen} {c.rule}"))
            rows.append(row(judged, comparisons, f"{resumed}/{judged.repeats}", done[0].speculative))

    with run.guard(), watching(cfg, "bench") as watch:
        watch.run(measure, watch.stop)
    run.table("runs", rows, "vllm bench serve cells on node 0 (cold: random; prefix hits: prefix_repetition): "
                            "medians of their runs (min–max)")  # fmt: skip
    run.data = {
        "folder": str(folder),
        "runs": [asdict(r) for r in runs],
        "cells": [asdict(c) for c in cells],
        "settings": {
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
        },
    }
    run.note(f"raw output and saved JSON of every run: `{folder}`")
    served, first, valid = sum(r.completed for r in runs), cells[0], sum(c.valid for c in cells)
    return run.passed(
        f"{valid} of {len(cells)} cells valid ({len(runs)} runs, {served} requests); {first.workload} "
        f"c{first.concurrency}: {first.figures['output_throughput']:.0f} output tok/s, mean TTFT "
        f"{first.figures['mean_ttft_ms']:.0f} ms"
    )
