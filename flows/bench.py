"""The bench stage: `vllm bench serve` (seed section 8) for the cold and prefix-hit workloads, at each concurrency.

Every request must succeed; each figure is compared with its baseline. Runs already measured in
this run's folder are not repeated (a sweep or a Retry resumes). The runs go on under a watch of
every rank: one that dies, logs a fatal line or gets stuck stops the tool and fails the stage within
seconds, naming node and DP rank (tasks/launch/liveness.py).
"""

import threading
from dataclasses import asdict
from typing import Any

from prefect import flow, runtime

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.errors import BenchStageFailed
from k3deploy.record import runs_dir
from k3deploy.stage import Finding, StageResult
from k3deploy.tasks.bench.results import BenchRun, compare
from k3deploy.tasks.bench.steps import planned_runs, run_bench, saved_run
from k3deploy.tasks.launch.liveness import watching
from k3deploy.tasks.render import render_plan
from k3deploy.tasks.stage_run import StageRun


@flow(name="bench")
def bench(config: ConfigSource) -> StageResult:
    """Each planned run passes when all its requests completed and its figures meet their baselines."""
    cfg = resolve_config(config)
    run = StageRun("bench", BenchStageFailed)
    folder = runs_dir() / str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id) / "bench"
    plan = render_plan(cfg)
    rows: list[dict[str, Any]] = []
    runs: list[BenchRun] = []

    def measure(stop: threading.Event) -> None:
        for workload, concurrency in planned_runs(cfg):
            done = saved_run(cfg, folder, workload, concurrency)
            resumed = done is not None
            if done is None:
                done = run_bench(cfg, plan, workload, concurrency, folder, stop)
            runs.append(done)
            subject = f"{workload} c{concurrency}"
            run.findings.append(
                Finding(subject, "every request served", done.ok,
                        f"{done.completed}/{done.num_prompts} completed, {done.failed} failed"
                        + ("" if done.failed_reported else " (num_prompts − completed: this vLLM reports no failed)"))
            )  # fmt: skip
            comparisons = compare(done, cfg.bench.baselines)
            for c in comparisons:
                seen = "missing" if c.value is None else f"{c.value:g}"
                run.findings.append(Finding(subject, f"{c.metric} vs baseline", c.ok, f"{seen} {c.rule}"))
            figures = done.figures
            rows.append(
                {
                    "workload": workload,
                    "concurrency": concurrency,
                    "completed": done.completed,
                    "failed": done.failed,
                    "output tok/s": figures.get("output_throughput"),
                    "mean TTFT ms": figures.get("mean_ttft_ms"),
                    "mean TPOT ms": figures.get("mean_tpot_ms"),
                    "p99 E2EL ms": figures.get("p99_e2el_ms"),
                    "acceptance": (done.speculative or {}).get("acceptance_rate"),
                    "baselines": "; ".join(f"{c.metric} {'ok' if c.ok else 'MISSED'}" for c in comparisons) or "-",
                    "resumed": resumed,
                }
            )

    with run.guard(), watching(cfg, "bench") as watch:
        watch.run(measure, watch.stop)
    run.table("runs", rows, "vllm bench serve runs on node 0 (cold: random; prefix hits: prefix_repetition)")
    run.data = {
        "folder": str(folder),
        "runs": [asdict(r) for r in runs],
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
            "draft": None if cfg.models.draft is None else cfg.models.draft.repo,
        },
    }
    run.note(f"raw output and saved JSON of every run: `{folder}`")
    served, cold = sum(r.completed for r in runs), runs[0].figures
    return run.passed(
        f"{len(runs)} runs, {served} requests, none failed; {runs[0].workload} c{runs[0].concurrency}: "
        f"{cold.get('output_throughput', 0):.0f} output tok/s, mean TTFT {cold.get('mean_ttft_ms', 0):.0f} ms"
    )
