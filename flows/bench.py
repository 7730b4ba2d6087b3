"""The bench stage: `vllm bench serve` (seed section 8) for the cold and prefix-hit workloads, at each concurrency.

Each cell (workload × concurrency) runs `bench.repeats` times and is VALID only when every request
succeeded, the prefix cache was as the workload means it (from /metrics around each run) and the
concurrency asked for was reached (tasks/bench/cells.py); its figures are medians with their spread,
compared with their baselines. Runs already measured in this run's folder under this very config are not
repeated (a sweep or a Retry resumes). The runs go on under a watch of every rank: one that dies, logs a fatal line or
gets stuck stops the tool and fails the stage within seconds, naming node and DP rank
(tasks/watch/liveness.py).
"""

from dataclasses import asdict

from prefect import flow, runtime

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import BenchStageFailed
from k3deploy.core.paths import run_folder
from k3deploy.core.stage import StageResult
from k3deploy.tasks.bench.sweep import Sweep, headline, settings
from k3deploy.tasks.render import render_plan
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.watch.liveness import watching


@flow(name="bench")
def bench(config: ConfigSource) -> StageResult:
    """Each planned run passes when all its requests completed and its figures meet their baselines."""
    cfg = resolve_config(config)
    run = StageRun("bench", BenchStageFailed)
    root = str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id)
    folder = run_folder(root, "bench") / cfg.evidence_key()
    plan = render_plan(cfg)
    sweep = Sweep(findings=run.findings)  # a cell judged before a rank was lost stays among the findings
    with run.guard(), watching(cfg, "bench") as watch:
        watch.run(sweep.measure, cfg, plan, folder, watch.stop)
    run.table("runs", sweep.rows, "vllm bench serve cells on node 0 (cold: random; prefix hits: prefix_repetition): "
                                  "medians of their runs (min–max)")  # fmt: skip
    run.data = {
        "folder": str(folder),
        "runs": [asdict(r) for r in sweep.runs],
        "cells": [asdict(c) for c in sweep.cells],
        "settings": settings(cfg),
        # the fullest any rank's KV cache was at a reading of /metrics during the runs (0-1; None: not reported)
        "kv_cache_usage_peak": watch.kv_peak,
    }
    run.note(f"raw output and saved JSON of every run: `{folder}`")
    return run.passed(headline(sweep))
