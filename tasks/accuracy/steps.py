"""The accuracy stage's I/O, on the machine running k3deploy: evaluator environments, runs, their files.

Each evaluator's output stays under the run's folder (`runs/<run>/accuracy/<evaluator>/`).
"""

from __future__ import annotations

import threading
from pathlib import Path

import yaml
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.accuracy import AisBenchSettings, EvaluatorEnvironment, LmEvalSettings
from k3deploy.blocks.image import ServingEnvironment
from k3deploy.core.errors import ToolFailed
from k3deploy.tasks.accuracy import commands
from k3deploy.tasks.accuracy.results import Evidence, Score, ais_scores, count_lines, dataset_hash, lm_eval_scores
from k3deploy.tasks.environment import provision_script
from k3deploy.tasks.stoppable import run_stoppable_on
from k3deploy.tasks.transport.base import OutputCallback
from k3deploy.tasks.transport.local import LocalTransport

HERE = "k3deploy"  # the evaluators run where k3deploy runs
TAIL_LINES = 30


def _shown(prefix: str, lines: list[str]) -> OutputCallback:
    logger = get_run_logger()

    def show(_host: str, _stream: str, line: str) -> None:
        lines.append(line)
        if line.strip():
            logger.info("%s: %s", prefix, line.rstrip()[-200:])

    return show


@task(name="evaluator environment", cache_policy=NO_CACHE)
def provision_evaluator(name: str, env: EvaluatorEnvironment) -> None:
    """Made once, reused while its spec is the same (the image stage's recipe, without vLLM's extras)."""
    spec = ServingEnvironment(path=env.path, python=env.python, packages=env.packages, remove=[], vllm_alias=False)
    LocalTransport(HERE).run(provision_script(spec), timeout=env.timeout_s, on_output=_shown(name, [])).check()


def _run(name: str, command: str, timeout: float, log: Path, stop: threading.Event | None) -> None:
    """The evaluator here, killed (its whole process group) once `stop` is set: the service was lost."""
    lines: list[str] = []
    done = run_stoppable_on(LocalTransport(HERE), command, timeout, stop, _shown(name, lines))
    log.write_text("\n".join(lines) + "\n")
    if done.exit_code != 0:
        raise ToolFailed(HERE, f"{name} exited {done.exit_code}:\n" + "\n".join(lines[-TAIL_LINES:]))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@task(name="lm_eval", cache_policy=NO_CACHE)
def run_lm_eval(
    settings: LmEvalSettings, model: str, base_url: str, folder: Path, stop: threading.Event | None = None
) -> list[Score]:
    """`settings` with include_path made absolute; `folder` absolute (lm_eval runs in include_path)."""
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / "output"
    command = commands.lm_eval_command(settings, model, base_url, str(output))
    _run("lm_eval", command, settings.timeout_s, folder / "lm_eval.log", stop)
    results = sorted(output.rglob("results_*.json"))
    if not results:
        raise ToolFailed(HERE, f"lm_eval wrote no results_*.json under {output}")
    samples = {}
    for name in settings.tasks:
        files = sorted(output.rglob(f"samples_{name}_*.jsonl"))
        if files:
            samples[name] = Evidence(str(files[-1]), files[-1].read_text())
    data = dataset_hash(_files(Path(settings.include_path))) if settings.include_path else "lm_eval's own datasets"
    sizes = task_sizes(settings)
    try:
        return lm_eval_scores(Evidence(str(results[-1]), results[-1].read_text()), samples, settings.tasks, sizes,
                              settings.metric, data)  # fmt: skip
    except ValueError as err:
        raise ToolFailed(HERE, str(err)) from None


def task_sizes(settings: LmEvalSettings) -> dict[str, int]:
    """Each configured task's size from its own data file (a task YAML in include_path with a local JSON Lines
    test split), at most `limit`; tasks of lm_eval's own are left to its n-samples."""
    if settings.include_path is None:
        return {}
    sizes: dict[str, int] = {}
    folder = Path(settings.include_path)
    for spec_file in sorted(folder.glob("*.yaml")):
        spec = yaml.safe_load(spec_file.read_text())
        if not isinstance(spec, dict) or spec.get("task") not in settings.tasks:
            continue
        files = (spec.get("dataset_kwargs") or {}).get("data_files")
        split = spec.get("test_split", "test")
        name = files.get(split) if isinstance(files, dict) else files
        if isinstance(name, str) and name.endswith(".jsonl") and (folder / name).is_file():
            size = count_lines((folder / name).read_text())
            sizes[spec["task"]] = size if settings.limit is None else min(size, settings.limit)
    return sizes


@task(name="AISBench", cache_policy=NO_CACHE)
def run_ais_bench(
    settings: AisBenchSettings, served: str, host: str, port: int, folder: Path, stop: threading.Event | None = None
) -> list[Score]:
    """`settings` with dataset_path made absolute; `folder` absolute (AISBench runs in it)."""
    assert settings.dataset_path is not None, "checked when the stage starts"
    config_dir, work = folder / "config", folder / "work"
    (config_dir / "models").mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    model = commands.ais_model_config(settings, served, host, port)
    (config_dir / "models" / f"{commands.AIS_MODEL}.py").write_text(model)
    _run("AISBench", commands.ais_command(settings, str(config_dir), str(work)), settings.timeout_s,
         folder / "ais_bench.log", stop)  # fmt: skip
    summaries = sorted(work.rglob("summary_*.csv"))
    if not summaries:
        raise ToolFailed(HERE, f"AISBench wrote no summary_*.csv under {work}")
    run_dir = summaries[-1].parents[1]
    dataset_file = Path(settings.dataset_path)
    dataset = dataset_file.name.split(".")[0]  # AISBench names a custom dataset after its file
    written = {p.stem: Evidence(str(p), p.read_text()) for p in (run_dir / "predictions").rglob("*.jsonl")}
    failures = {k.removesuffix("_failed"): v for k, v in written.items() if k.endswith("_failed")}
    predictions = {k: v for k, v in written.items() if not k.endswith("_failed")}
    sizes = {dataset: count_lines(dataset_file.read_text())}
    version = LocalTransport(HERE).run(commands.version_command(settings.environment.path, "ais-bench-benchmark"), 60)
    data = dataset_hash({dataset_file.name: dataset_file.read_bytes()})
    try:
        return ais_scores(Evidence(str(summaries[-1]), summaries[-1].read_text()), predictions, failures, sizes,
                          version.check().stdout.strip(), data)  # fmt: skip
    except ValueError as err:
        raise ToolFailed(HERE, str(err)) from None
