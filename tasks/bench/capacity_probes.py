"""The capacity search's I/O: each probe a real `vllm bench serve` run (the bench stage's own task) on node 0, judged
VALID by the bench's rules and then against the SLOs (tasks/bench/capacity.py).

A probe is the bench's cold workload (random) at one concurrency, with the SLO's percentile among the metrics and
vLLM's --goodput set from the SLOs. Its saved JSON goes to the run's capacity folder: a Retry of the run resumes the
search from the probes already measured under this very config, and runs only what is left.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from k3deploy.blocks.bench import Baseline, Slo
from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.tasks.bench.capacity import (
    Answer,
    Probe,
    judge,
    nearest_below,
    next_step,
    percentile_key,
    probe_prompts,
    queue_wait_ms,
)
from k3deploy.tasks.bench.cells import cell
from k3deploy.tasks.bench.steps import read_metrics, reset_prefix_cache, run_bench, saved_run
from k3deploy.tasks.bench.sweep import served
from k3deploy.tasks.render import Plan, bench_file

WORKLOAD = "random"  # the cold workload: a capacity served from a warm prefix cache is not the service's


def probe_config(cfg: DeploymentConfig, concurrency: int) -> DeploymentConfig:
    """The bench settings of one probe: its prompts, the SLO's percentile among the metrics, --goodput from the
    SLOs, one run; the latency SLOs as its baselines (so the run keeps their figures, and a percentile too few
    requests stand behind makes it INVALID, as a judged one does in bench)."""
    conf, bench = cfg.capacity, cfg.bench
    percentiles = list(dict.fromkeys([*bench.metric_percentiles.split(","), f"{conf.slo.percentile:g}", "50"]))
    metrics = list(dict.fromkeys([*bench.percentile_metrics.split(","), "ttft", "tpot"]))
    update = {
        "num_prompts": probe_prompts(concurrency, conf, bench.validity.tail_confidence),
        "metric_percentiles": ",".join(percentiles),
        "percentile_metrics": ",".join(metrics),
        "slo": Slo(ttft_ms=conf.slo.ttft_ms, tpot_ms=conf.slo.tpot_ms),
        "repeats": 1,
        "baselines": [Baseline(metric=percentile_key(conf.slo, metric), value=limit, threshold=1.0)
                      for metric, limit in (("ttft", conf.slo.ttft_ms), ("tpot", conf.slo.tpot_ms)) if limit],
    }  # fmt: skip
    return cfg.model_copy(update={"bench": bench.model_copy(update=update)})


@dataclass
class Search:
    """The probes so far (kept when the watch stops it half-way, for the stage's record) and the answer."""

    probes: list[Probe] = field(default_factory=list)
    answer: Answer | None = None

    def measure(self, cfg: DeploymentConfig, plan: Plan, folder: Path, stop: threading.Event,
                say: Callable[[str], None]) -> None:  # fmt: skip
        started = time.monotonic()
        spent = 0.0  # minutes of probes run in this attempt and the ones resumed (their own durations)
        while not stop.is_set():
            step = next_step(self.probes, cfg.capacity, spent)
            if isinstance(step, Answer):
                self.answer = step
                return
            probe_cfg = probe_config(cfg, step)
            began = time.monotonic()
            run = saved_run(probe_cfg, folder, WORKLOAD, step)
            resumed = run is not None
            queue_file = (folder / bench_file(WORKLOAD, step, 1)).with_suffix(".queue.json")
            if run is None:
                if probe_cfg.bench.reset_prefix_cache and probe_cfg.serve.enable_prefix_caching:
                    reset_prefix_cache(probe_cfg)
                before = read_metrics(cfg)
                run = run_bench(probe_cfg, plan, WORKLOAD, step, folder, stop)
                queue_file.write_text(json.dumps({"mean_queue_ms": queue_wait_ms(before, read_metrics(cfg))}) + "\n")
            waited = json.loads(queue_file.read_text()).get("mean_queue_ms") if queue_file.exists() else None
            judged = cell([run], probe_cfg.bench.validity, served(probe_cfg), probe_cfg.bench.baselines)
            seconds = run.tool_seconds or run.figures.get("duration") or (time.monotonic() - began)
            probe = judge(judged, cfg.capacity, nearest_below(self.probes, step), seconds, resumed, waited)
            self.probes.append(probe)
            spent += seconds / 60
            say(f"capacity probe {len(self.probes)} at concurrency {step}: {probe.outcome}"
                f"{' (resumed)' if resumed else ''}; {probe.why} [{time.monotonic() - started:.0f} s]")  # fmt: skip


def probe_row(p: Probe, answer: Answer | None) -> dict[str, object]:
    """A probe as a row of the stage's `probes` table."""
    marks = [m for m, probe in (("answer", answer and answer.below), ("above", answer and answer.above))
             if probe is not None and probe.concurrency == p.concurrency]  # fmt: skip
    return {
        "concurrency": p.concurrency,
        "outcome": p.outcome,
        "mark": ", ".join(marks) or "-",
        "requests": f"{p.completed}/{p.num_prompts}",
        "achieved concurrency": p.figures.get("achieved_concurrency"),
        **{k: v for k, v in p.figures.items() if k not in ("achieved_concurrency",)},
        "why": p.why + (f"; saturated: {p.saturated}" if p.saturated and p.saturated not in p.why else ""),
        "resumed": p.resumed,
    }


def as_dict(p: Probe) -> dict[str, object]:
    return dataclasses.asdict(p) | {"outcome": p.outcome}
