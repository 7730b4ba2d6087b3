"""The accuracy stage's I/O, on the machine running k3deploy: evaluator environments, runs, their files.

Each evaluator's output stays under the run's folder (`runs/<run>/accuracy/<evaluator>/`).
"""

from __future__ import annotations

import threading
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.accuracy import AisBenchSettings, EvaluatorEnvironment, LmEvalSettings
from k3deploy.blocks.image import ServingEnvironment
from k3deploy.errors import NodeError
from k3deploy.tasks.accuracy import commands
from k3deploy.tasks.accuracy.results import Score, ais_scores, dataset_hash, lm_eval_scores
from k3deploy.tasks.image.environment import provision_script
from k3deploy.tasks.launch.stoppable import run_stoppable_on
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
        raise NodeError(HERE, f"{name} exited {done.exit_code}:\n" + "\n".join(lines[-TAIL_LINES:]))


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
        raise NodeError(HERE, f"lm_eval wrote no results_*.json under {output}")
    samples = {task: "".join(p.read_text() for p in output.rglob(f"samples_{task}_*.jsonl")) for task in settings.tasks}
    data = dataset_hash(_files(Path(settings.include_path))) if settings.include_path else "lm_eval's own datasets"
    try:
        return lm_eval_scores(results[-1].read_text(), samples, settings.metric, data)
    except ValueError as err:
        raise NodeError(HERE, f"{results[-1]}: {err}") from None


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
        raise NodeError(HERE, f"AISBench wrote no summary_*.csv under {work}")
    run_dir = summaries[-1].parents[1]
    dataset_file = Path(settings.dataset_path)
    dataset = dataset_file.name.split(".")[0]  # AISBench names a custom dataset after its file
    predictions = {p.stem: p.read_text() for p in (run_dir / "predictions").rglob("*.jsonl")}
    failures = {k.removesuffix("_failed"): v for k, v in predictions.items() if k.endswith("_failed")}
    expected = {dataset: sum(1 for line in dataset_file.read_text().splitlines() if line.strip())}
    version = LocalTransport(HERE).run(commands.version_command(settings.environment.path, "ais-bench-benchmark"), 60)
    data = dataset_hash({dataset_file.name: dataset_file.read_bytes()})
    try:
        return ais_scores(summaries[-1].read_text(), predictions, failures, expected, version.check().stdout.strip(),
                          data)  # fmt: skip
    except ValueError as err:
        raise NodeError(HERE, f"{summaries[-1]}: {err}") from None
