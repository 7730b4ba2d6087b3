"""The bench stage's I/O: `vllm bench serve` on node 0 beside the server, its saved JSON kept in the run's folder.

It runs where the server's vLLM is (inside node 0's container, or with the serving environment of
the process runtime), so the tool's version and tokenizer are the server's. A run whose JSON is
already in the run's folder is not run again: a sweep, or a Retry of the same run, resumes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import threading
import time
from pathlib import Path

import httpx
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.logging import get_logger, get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import CommandTimeout, NodeError, ToolFailed, UnreadableEvidence
from k3deploy.tasks.bench.results import (
    BenchRun,
    acceptance,
    parse_acceptance,
    parse_prefix_cache,
    parse_result,
    prefix_cache,
    required_figures,
)
from k3deploy.tasks.endpoints import service_url
from k3deploy.tasks.render import NodePlan, Plan, bench_argv, bench_file, bench_result_dir
from k3deploy.tasks.runtime import Runtime, serving_runtimes
from k3deploy.tasks.sized_read import parse_sized, sized_read_command

TAIL_LINES = 30
READ_ATTEMPTS = 3


def planned_runs(cfg: DeploymentConfig) -> list[tuple[str, int]]:
    """(workload, concurrency) in order: the cold workload first, then prefix hits; each at every concurrency."""
    workloads = ["random", *(["prefix_repetition"] if cfg.bench.prefix_hit else [])]
    concurrencies = list(dict.fromkeys([cfg.bench.max_concurrency, *cfg.bench.concurrency_sweep]))
    return [(w, c) for w in workloads for c in concurrencies]


def _sidecars(path: Path) -> tuple[Path, Path]:
    """Beside a saved result: the draft acceptance (`*.spec.json`) and the prefix cache's use (`*.cache.json`)."""
    return path.with_suffix(".spec.json"), path.with_suffix(".cache.json")


def read_saved(
    cfg: DeploymentConfig, folder: Path, workload: str, concurrency: int, repeat: int = 1
) -> BenchRun | None:
    """A run already measured in this run's folder, None if not yet; UnreadableEvidence naming the damaged file."""
    path = folder / bench_file(workload, concurrency, repeat)
    spec, cache = _sidecars(path)
    if not path.exists():
        return None
    required = required_figures(workload, concurrency, cfg.bench.baselines, bool(cfg.bench.slo.goodput_args()))
    damaged = path
    try:
        run = dataclasses.replace(parse_result(path.read_text(), workload, concurrency, required), repeat=repeat)
        damaged = spec
        if spec.exists():
            run = dataclasses.replace(run, speculative=parse_acceptance(spec.read_text()))
        damaged = cache
        if cache.exists():
            run = dataclasses.replace(run, prefix_cache=parse_prefix_cache(cache.read_text()))
        return run
    except (OSError, ValueError) as err:
        raise UnreadableEvidence(f"{damaged}: {err}") from None


def saved_run(cfg: DeploymentConfig, folder: Path, workload: str, concurrency: int, repeat: int = 1) -> BenchRun | None:
    """read_saved, where damaged files are kept beside as `*.unreadable`, with a warning, and None says: run it
    again (damage is never a measured run)."""
    try:
        return read_saved(cfg, folder, workload, concurrency, repeat)
    except UnreadableEvidence as err:
        path = folder / bench_file(workload, concurrency, repeat)
        _logger().warning("%s; kept as *.unreadable and measured again", err)
        for kept in (path, *_sidecars(path)):
            if kept.exists():
                kept.replace(kept.with_name(kept.name + ".unreadable"))
        return None


def reset_prefix_cache(cfg: DeploymentConfig, attempts: int = 20, pause_s: float = 0.5) -> None:
    """Empty the servers' prefix cache (bench.reset_prefix_cache), so no run is served from an earlier one's.
    vLLM answers {"success": false} while running requests still hold blocks: asked again, a bounded number of
    times."""
    url, node = f"{service_url(cfg)}/reset_prefix_cache", cfg.cluster.nodes[0].name
    for attempt in range(attempts):
        try:
            answer = httpx.post(url, timeout=cfg.smoke.request_timeout_s)
        except httpx.HTTPError as err:
            raise NodeError(node, f"POST {url} failed: {err}") from None
        if answer.status_code >= 300:
            hint = (
                " (vLLM serves it only with VLLM_SERVER_DEV_MODE=1 in serve.env)" if answer.status_code == 404 else ""
            )
            raise NodeError(node, f"POST {url} answered {answer.status_code}{hint}: bench.reset_prefix_cache cannot "
                                  "be honoured")  # fmt: skip
        try:
            if answer.json().get("success") is True:
                return
        except (ValueError, AttributeError):
            raise NodeError(node, f'POST {url} answered {answer.text[:200]!r}, not vLLM\'s {{"success": …}}') from None
        if attempt + 1 < attempts:
            time.sleep(pause_s)  # requests still finishing hold blocks
    raise NodeError(node, f"POST {url} answered success false {attempts} times: requests kept holding cache blocks")


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except MissingContextError:  # outside a flow (a test, a script)
        return get_logger("k3deploy.bench")


def _write_whole(path: Path, text: str) -> None:
    """Written beside and renamed: a file in the run's folder is whole or absent, never cut by a crash."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


def read_beside(beside: Runtime, node: NodePlan, path: str, attempts: int = READ_ATTEMPTS) -> str:
    """The saved result's text, read where the tool ran; read again when the answer did not hold all of it."""
    command = sized_read_command(path)
    for _ in range(attempts):
        text = parse_sized(beside.run_beside(node, command, 120).check().stdout)
        if text is not None:
            return text
    raise NodeError(node.node, f"{path}: its contents did not arrive whole in {attempts} reads (the node's "
                               "engine or connection dropped the output); the file is left there")  # fmt: skip


def read_metrics(cfg: DeploymentConfig) -> str:
    try:
        return httpx.get(f"{service_url(cfg)}/metrics", timeout=cfg.smoke.request_timeout_s).text
    except httpx.HTTPError:
        return ""


@task(name="vllm bench serve", cache_policy=NO_CACHE)
def run_bench(
    cfg: DeploymentConfig,
    plan: Plan,
    workload: str,
    concurrency: int,
    folder: Path,
    stop: threading.Event | None = None,
    repeat: int = 1,
) -> BenchRun:
    """One run on node 0; its output and saved JSON go to `folder`. NodeError when the tool fails; killed on
    the node once `stop` is set (the service was lost)."""
    logger = get_run_logger()
    node = plan.nodes[0]
    argv = bench_argv(cfg, workload, concurrency, repeat)
    result_dir = bench_result_dir(cfg)
    where = shlex.quote(result_dir)
    name = bench_file(workload, concurrency, repeat)
    folder.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def show(line: str) -> None:
        lines.append(line)
        if line.strip():
            logger.info("%s c%d: %s", workload, concurrency, line.rstrip()[-200:])

    before = read_metrics(cfg)
    with serving_runtimes(cfg) as runtimes:
        beside = runtimes[node.node]
        command = f"mkdir -p {where} && {shlex.join(argv)}"
        try:
            done = beside.run_beside(node, command, cfg.bench.timeout_s, show, stop)
        except CommandTimeout:
            tail = "\n".join(lines[-TAIL_LINES:])
            raise ToolFailed(node.node, f"vllm bench serve ({workload}, concurrency {concurrency}) killed after "
                                       f"bench.timeout_s {cfg.bench.timeout_s:g} s:\n{tail}") from None  # fmt: skip
        finally:
            (folder / name.replace(".json", ".log")).write_text("\n".join(lines) + "\n")
        if done.exit_code != 0:
            tail = "\n".join(lines[-TAIL_LINES:])
            raise ToolFailed(node.node, f"vllm bench serve ({workload}, concurrency {concurrency}) exited "
                                       f"{done.exit_code}:\n{tail}")  # fmt: skip
        text = read_beside(beside, node, f"{result_dir}/{name}")
        saved, parent = f"{where}/{shlex.quote(name)}", shlex.quote(cfg.bench.result_dir)
        beside.run_beside(node, f"rm -f {saved}; rmdir {where} {parent} 2>/dev/null || true", 120)  # kept here only
    after = read_metrics(cfg)
    spec, cache = acceptance(before, after), prefix_cache(before, after)
    try:
        run = parse_result(
            text,
            workload,
            concurrency,
            required_figures(workload, concurrency, cfg.bench.baselines, bool(cfg.bench.slo.goodput_args())),
        )
    except ValueError as err:
        kept = folder / f"{name}.unreadable"
        kept.write_text(text)
        raise ToolFailed(node.node, f"{result_dir}/{name} (kept as {kept}): {err}") from None
    spec_file, cache_file = _sidecars(folder / name)
    for sidecar, found in ((spec_file, spec), (cache_file, cache)):  # first: the JSON marks the run as measured
        if found is not None:
            _write_whole(sidecar, json.dumps(found) + "\n")
    _write_whole(folder / name, text)
    return dataclasses.replace(run, speculative=spec, prefix_cache=cache, repeat=repeat,
                               tool_seconds=round(done.duration_s, 3))  # fmt: skip
