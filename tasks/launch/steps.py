"""Prefect tasks of the launch stage: thin wrappers over the runtimes, the watch and readiness."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import K3DeployError
from k3deploy.core.stage import FailureCause, FailureClass, Finding
from k3deploy.tasks.containers import Started
from k3deploy.tasks.endpoints import service_url
from k3deploy.tasks.launch.engine_report import disagreements, parse_report
from k3deploy.tasks.launch.readiness import Probe, burst, probe
from k3deploy.tasks.live_server import differences
from k3deploy.tasks.render import Plan
from k3deploy.tasks.runtime import serving_runtimes
from k3deploy.tasks.watch.logwatch import LogWatcher, load_patterns
from k3deploy.tasks.watch.monitor import Failure, LaunchMonitor

LOG_TAIL = 40  # log lines per node shown in the launch summary artifact


class ServiceNotReady(K3DeployError):
    """The service did not come up: a fatal line, a container exit, or the ready timeout.

    `record` (milestones, each node's last log lines) is attached by wait_until_ready.
    """

    def __init__(self, message: str, failure: Failure | None = None) -> None:
        super().__init__(message)
        self.failure = failure
        self.record: LaunchRecord | None = None

    def finding(self) -> Finding:
        where = f"{self.failure.node} (DP rank {self.failure.rank})" if self.failure else "the service"
        return Finding(where, "ready", False, str(self))

    def cause(self) -> FailureCause:
        """The engine's, with the rank lost and its line (the cause, then the line) when the monitor named one."""
        lost = self.failure
        if lost is None:
            return FailureCause(failure_class=FailureClass.ENGINE, evidence=str(self))
        evidence = f"{lost.reason}: {lost.line}" if lost.line else lost.reason
        return FailureCause(failure_class=FailureClass(lost.failure_class or FailureClass.ENGINE), evidence=evidence,
                            node=lost.node, dp_rank=lost.rank, log_line=lost.log_line, family=lost.family)  # fmt: skip


class NotAsPlanned(ServiceNotReady):
    """A rank runs other flags, environment, image or devices than the plan: whatever it serves is not this
    config's (an adopted server started otherwise, or one changed behind k3deploy's back)."""

    def cause(self) -> FailureCause:
        lost = self.failure
        assert lost is not None, "a rank that differs is named"
        return FailureCause(
            failure_class=FailureClass.INFRASTRUCTURE, evidence=lost.reason, node=lost.node, dp_rank=lost.rank
        )


class EngineDisagrees(ServiceNotReady):
    """The engine, once ready, reports a DP size or context length other than the config's: what is measured
    next would not be this config's (class engine, node 0 named)."""


@dataclass
class LaunchRecord:
    run_id: str
    started: dict[str, bool] = field(default_factory=dict)  # node → adopted
    time_to_ready_s: float | None = None
    milestones: list[dict[str, Any]] = field(default_factory=list)
    log_files: dict[str, str] = field(default_factory=dict)
    burst_requests: int = 0
    failure: str | None = None
    tails: dict[str, list[str]] = field(default_factory=dict)  # node → its last log lines
    live: list[dict[str, Any]] = field(default_factory=list)  # per rank: what runs, read back, against the plan
    engine: dict[str, Any] = field(default_factory=dict)  # what the engine reports of itself once ready


@task(name="start containers", cache_policy=NO_CACHE)
def start_containers(cfg: DeploymentConfig, plan: Plan) -> dict[str, Started]:
    """Node 0 first, then the headless ranks in order, each exactly as the plan shows it."""
    logger = get_run_logger()
    started: dict[str, Started] = {}
    with serving_runtimes(cfg) as runtimes:
        for node_plan in plan.nodes:
            done = runtimes[node_plan.node].start(node_plan)
            started[node_plan.node] = done
            verb = "adopted running" if done.adopted else "started"
            logger.info("%s: %s %s (DP rank %d)", node_plan.node, verb, done.name, node_plan.dp_rank)
    return started


@task(name="wait until ready", cache_policy=NO_CACHE)
def wait_until_ready(
    cfg: DeploymentConfig, plan: Plan, started: dict[str, Started], run_id: str, logs: Path
) -> LaunchRecord:
    """Follow every container until node 0 answers real requests; fail at the first fatal line or exit."""
    logger = get_run_logger()
    ready = cfg.serve.readiness
    record = LaunchRecord(run_id, {n: s.adopted for n, s in started.items()})
    watcher = LogWatcher(load_patterns())
    monitor = LaunchMonitor(watcher, logs)
    base_url = service_url(cfg)
    t0 = time.monotonic()
    deadline = t0 + ready.timeout_s
    last: Probe | None = None
    with serving_runtimes(cfg) as runtimes:
        for node_plan in plan.nodes:
            node = node_plan.node
            monitor.follow(node, node_plan.dp_rank, runtimes[node], started[node].handle)
        try:
            while True:
                _raise_if_failed(monitor)
                result = probe(base_url, cfg.serve.served_model_name, ready.request_timeout_s)
                if result.ready:
                    break
                if result != last:
                    logger.info("not ready yet: %s", result.detail)
                    last = result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    said = monitor.cause_in_logs(f"not ready after {ready.timeout_s:g}s")  # a rank's own words
                    raise ServiceNotReady(
                        f"not ready after {ready.timeout_s:g}s; the last probe: {result.detail}; "
                        f"milestones seen: {watcher.milestones()}"
                        + (f"; {said.describe()}" if said is not None else ""),
                        said,
                    )
                monitor.failed.wait(min(ready.poll_s, remaining))  # wakes at once on a failure
            record.time_to_ready_s = round(time.monotonic() - t0, 3)
            count = ready.burst_requests or 4 * cfg.serve.data_parallel_size
            failures = burst(base_url, cfg.serve.served_model_name, count, ready.request_timeout_s)
            _raise_if_failed(monitor)  # a rank that died during the burst is named, not just counted
            if failures:
                raise ServiceNotReady(
                    f"{len(failures)} of {count} concurrent requests failed: a DP rank is not serving; "
                    + "; ".join(failures[:5])
                )
            record.burst_requests = count
            logger.info("ready after %.1fs; %d concurrent requests answered", record.time_to_ready_s, count)
        except ServiceNotReady as err:
            record.failure = str(err)
            err.record = record  # completed by the finally below
            raise
        finally:
            monitor.stop()
            record.milestones = watcher.milestone_rows(t0)
            record.log_files = {node: str(buffer.path) for node, buffer in monitor.buffers.items()}
            record.tails = {node: buffer.tail(LOG_TAIL) for node, buffer in monitor.buffers.items()}
    return record


@task(name="check what runs", cache_policy=NO_CACHE)
def check_what_runs(
    cfg: DeploymentConfig, plan: Plan, started: dict[str, Started], run_id: str
) -> list[dict[str, Any]]:
    """Read back from every rank what it runs and compare it with the plan, key by key, before waiting on it
    (a rank adopted with other flags would be waited on for nothing); NotAsPlanned names the node, its DP rank
    and every key that differs."""
    rows, first = [], None
    with serving_runtimes(cfg) as runtimes:
        for node_plan in plan.nodes:
            node = node_plan.node
            live = runtimes[node].live(started[node].handle)
            found = [] if live is None else differences(node_plan, live)
            how = (
                "exited (the launch's watch names it)"
                if live is None
                else "adopted"
                if started[node].adopted
                else "started"
            )
            rows.append({"node": node, "dp rank": node_plan.dp_rank, "how": how, "differs": "; ".join(found)})
            if found and first is None:
                first = Failure(node, node_plan.dp_rank, "runs what the plan does not say: " + "; ".join(found),
                                None, time.time(), None)  # fmt: skip
    if first is not None:
        error = NotAsPlanned(first.describe(), first)
        error.record = LaunchRecord(run_id, {n: s.adopted for n, s in started.items()}, live=rows)
        raise error
    return rows


@task(name="check what the engine reports", cache_policy=NO_CACHE)
def check_engine_report(cfg: DeploymentConfig, plan: Plan) -> dict[str, Any]:
    """Node 0's /metrics and /v1/models against the config: every DP rank reporting, the context length asked
    for; the KV-cache size each rank sized itself (memory headroom's denominator) is kept in the record."""
    url, timeout = service_url(cfg), cfg.serve.readiness.request_timeout_s
    try:
        text = httpx.get(f"{url}/metrics", timeout=timeout).raise_for_status().text
        models = httpx.get(f"{url}/v1/models", timeout=timeout).raise_for_status().text
        report = parse_report(text, models, cfg.serve.served_model_name)
    except (httpx.HTTPError, K3DeployError) as err:
        node = plan.nodes[0]
        failure = Failure(node.node, node.dp_rank, str(err), None, time.time(), None)
        raise EngineDisagrees(f"the engine's own report could not be read: {err}", failure) from None
    found = disagreements(report, cfg.serve.data_parallel_size, cfg.serve.max_model_len)
    if found:
        node = plan.nodes[0]
        said = "; ".join(f"{key}: {what}" for key, what in found)
        raise EngineDisagrees(f"the engine reports itself otherwise than the config: {said}",
                              Failure(node.node, node.dp_rank, said, None, time.time(), None))  # fmt: skip
    get_run_logger().info("the engine reports DP ranks %s, max_model_len %s, KV cache %s tokens per rank (fewest)",
                          ", ".join(report.engines), report.max_model_len, report.kv_tokens)  # fmt: skip
    return report.as_data()


def _raise_if_failed(monitor: LaunchMonitor) -> None:
    if monitor.failure is not None:
        raise ServiceNotReady(monitor.failure.describe(), monitor.failure)
