"""Following the service while a stage uses it: a rank that exits, logs a fatal line or gets stuck fails the stage.

Smoke, bench and accuracy each run their work under `watching(cfg, stage)`: every node's server is
followed as launch followed it (its exit, and its log from the start through the same watcher, so
a fatal line written between stages is seen too), and node 0's /metrics is read every
`serve.liveness.metrics_poll_s` for a stuck rank (tasks/watch/stall.py). The first failure stops
the stage's tool (its `stop` event, see tasks/stoppable.py) and the stage fails within
seconds, naming node and DP rank, instead of waiting for a request timeout hours away.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
from prefect import runtime

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import ServiceLost
from k3deploy.core.paths import run_folder
from k3deploy.tasks.endpoints import engines, service_url
from k3deploy.tasks.launch.engine_report import kv_usage_peak
from k3deploy.tasks.render import NodePlan, render_plan
from k3deploy.tasks.runtime import serving_runtimes
from k3deploy.tasks.watch.logwatch import LogWatcher, load_patterns
from k3deploy.tasks.watch.monitor import Failure, LaunchMonitor
from k3deploy.tasks.watch.stall import StallDetector, readings

T = TypeVar("T")
WAKE_S = 0.25  # how often the stage's wait looks at both the work and the watch


def handle(node_plan: NodePlan) -> str:
    """The server's name on its node: the container, or the process folder."""
    spec = node_plan.container or node_plan.process
    assert spec is not None, "a node plan renders a container or a process"
    return spec.name


class ServiceWatch:
    """One stage's watch over every rank; `run(fn)` does the stage's work under it."""

    def __init__(self, cfg: DeploymentConfig, stage: str, log_dir: Path) -> None:
        self.cfg, self.stage = cfg, stage
        self.stop = threading.Event()  # set once the service is lost: the stage's tools stop
        self.monitor = LaunchMonitor(LogWatcher(load_patterns()), log_dir, phase=stage, log_suffix=f".{stage}")
        self._closing = threading.Event()
        self.kv_peak: float | None = None  # the fullest any rank's KV cache was at a reading (memory headroom)

    def watch_progress(self) -> None:
        """Node 0's /metrics until closed: a stuck rank, or node 0 not answering, is a failure."""
        live = self.cfg.serve.liveness
        url, ranks = service_url(self.cfg), engines(self.cfg)
        node0 = self.cfg.cluster.nodes[0].name
        detector = StallDetector(live.stall_timeout_s)
        answered = time.monotonic()
        while not self._closing.wait(live.metrics_poll_s):
            now = time.monotonic()
            try:
                text = httpx.get(f"{url}/metrics", timeout=min(live.stall_timeout_s, 30)).raise_for_status().text
            except httpx.HTTPError as err:
                if now - answered >= live.stall_timeout_s:
                    why = f"node 0 has not answered {url}/metrics for {now - answered:.0f} s during {self.stage}"
                    self.monitor.fail(Failure(node0, 0, why, f"{type(err).__name__}: {err}", time.time(), None))
                continue
            answered = now
            usage = kv_usage_peak(text)
            if usage is not None:
                self.kv_peak = max(usage, self.kv_peak or 0.0)
            stuck = sorted(detector.observe(now, readings(text)), key=lambda s: (len(s.engine), s.engine))
            if stuck:
                first = stuck[0]
                named = "; ".join(f"DP rank {s.engine} ({ranks.get(s.engine, '?')}): {s.running} request(s) running"
                                  for s in stuck)  # fmt: skip
                many = (
                    f"{len(stuck)} ranks at once (with expert parallelism one hung rank holds every other: which one "
                    "hangs cannot be told from /metrics): "
                    if len(stuck) > 1
                    else ""
                )
                reason = (
                    f"stuck during {self.stage}: no token processed for {first.seconds:g} s (node 0's /metrics): "
                    f"{many}{named}"
                )
                rank = int(first.engine) if first.engine.isdigit() else -1
                self.monitor.fail(Failure(ranks.get(first.engine, node0), rank, reason, None, time.time(), None))

    def lost(self) -> ServiceLost | None:
        failure = self.monitor.failure
        if failure is None:
            return None
        reason = failure.reason + (f": {failure.line}" if failure.line else "")
        return ServiceLost(self.stage, failure.node, failure.rank, reason, failure.log_line, failure.failure_class,
                           failure.family)  # fmt: skip

    def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """`fn(*args, **kwargs)` in a thread of its own (with this run's Prefect context); its result, or
        ServiceLost as soon as the service is lost (its tools are stopped and given the grace to end)."""
        lost = self.lost()
        if lost is not None:  # already gone (between stages, or while the stage prepared): nothing is started
            raise lost
        context = contextvars.copy_context()
        outcome: dict[str, object] = {}
        done = threading.Event()

        def work() -> None:
            try:
                outcome["value"] = context.run(fn, *args, **kwargs)
            except BaseException as err:  # handed to the stage's thread below
                outcome["error"] = err
            finally:
                done.set()

        threading.Thread(target=work, daemon=True, name=f"k3deploy-{self.stage}").start()
        try:
            while not done.wait(WAKE_S):
                if self.monitor.failed.is_set():
                    self.stop.set()
                    done.wait(self.cfg.serve.liveness.stop_grace_s)
                    break
        finally:
            if not done.is_set():  # lost, or this thread leaves early (cancelled): its tools do not outlive it
                self.stop.set()
        lost = self.lost()
        if lost is not None:
            raise lost
        if "error" in outcome:
            raise outcome["error"]  # type: ignore[misc]
        return outcome["value"]  # type: ignore[return-value]

    def close(self) -> None:
        self._closing.set()
        self.monitor.stop()


@contextlib.contextmanager
def watching(cfg: DeploymentConfig, stage: str) -> Iterator[ServiceWatch]:
    """Every rank followed for the block's duration; a rank already gone fails the first `run` at once."""
    plan = render_plan(cfg)
    run_id = str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id)
    watch = ServiceWatch(cfg, stage, run_folder(run_id, "logs"))
    with serving_runtimes(cfg) as runtimes:
        for node_plan in plan.nodes:
            watch.monitor.follow(node_plan.node, node_plan.dp_rank, runtimes[node_plan.node], handle(node_plan))
        progress = threading.Thread(target=watch.watch_progress, daemon=True, name=f"k3deploy-{stage}-metrics")
        progress.start()
        try:
            yield watch
        finally:
            watch.close()
