"""The accuracy stage: lm_eval and AISBench against the served endpoint, from local datasets.

Each score comes with its evaluator's version, the dataset's hash and the sample accounting
(completed, failed, missing, unparsed, of the dataset's size); it fails when samples were lost or a score is off its
baseline by more than the threshold. Not applicable until an evaluator is chosen. The evaluations
run under a watch of every rank (tasks/launch/liveness.py), as smoke and bench do.
"""

from dataclasses import asdict
from pathlib import Path

from prefect import flow, runtime

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.errors import AccuracyStageFailed, ConfigError
from k3deploy.paths import run_folder
from k3deploy.stage import FailureClass, Finding, StageResult
from k3deploy.tasks.accuracy.results import Score, compare
from k3deploy.tasks.accuracy.steps import provision_evaluator, run_ais_bench, run_lm_eval
from k3deploy.tasks.endpoints import service_url
from k3deploy.tasks.launch.liveness import watching
from k3deploy.tasks.stage_run import StageRun


@flow(name="accuracy")
def accuracy(config: ConfigSource) -> StageResult:
    """Every chosen evaluator to a score with its samples accounted for."""
    cfg = resolve_config(config)
    settings = cfg.accuracy
    run = StageRun("accuracy", AccuracyStageFailed)
    if not settings.evaluators:
        return run.not_applicable("no evaluator chosen (accuracy.evaluators: lm_eval, ais_bench)")
    folder = run_folder(str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id), "accuracy").resolve()
    scores: list[Score] = []
    with run.guard(), watching(cfg, "accuracy") as watch:
        # Relative dataset paths are taken from the folder k3deploy runs in (the evaluators run elsewhere).
        lm = settings.lm_eval.model_copy(update={"include_path": _absolute(settings.lm_eval.include_path)})
        ais = settings.ais_bench.model_copy(update={"dataset_path": _absolute(settings.ais_bench.dataset_path)})
        missing = [
            (f"accuracy.{name}.{key}", f"{value or 'not set'}: no such file or folder here")
            for name, key, value in (("lm_eval", "include_path", lm.include_path),
                                     ("ais_bench", "dataset_path", ais.dataset_path))
            if name in settings.evaluators and (value is None or not Path(value).exists())
        ]  # fmt: skip
        if missing:
            raise ConfigError(missing)
        node0 = cfg.cluster.nodes[0]
        for name in settings.evaluators:
            chosen = lm if name == "lm_eval" else ais
            provision_evaluator(name, chosen.environment)
            found = (
                watch.run(run_lm_eval, lm, cfg.serve.served_model_name, service_url(cfg), folder / name, watch.stop)
                if name == "lm_eval"
                else watch.run(run_ais_bench, ais, cfg.serve.served_model_name, node0.serving_ip,
                               cfg.serve.service_port, folder / name, watch.stop)
            )  # fmt: skip
            for score in found:
                subject = f"{name} {score.dataset}"
                counts = f"{score.completed} completed, {score.failed} failed, {score.missing} missing"
                lost = None if score.samples_ok else FailureClass.ENGINE if score.failed else FailureClass.TOOL
                run.findings.append(
                    Finding(subject, "samples", score.samples_ok,
                            f"{counts}, {score.unparsed} unparsed of {score.dataset_size}", lost)
                )  # fmt: skip
                verdict = compare(score, chosen)
                if verdict is not None:
                    run.findings.append(Finding(subject, f"{score.metric} vs baseline", verdict[0], verdict[1]))
            scores += found
    rows = [asdict(s) for s in scores]
    run.table("scores", rows, "scores with sample accounting (completed, failed, missing, unparsed)")
    run.data = {"folder": str(folder), "scores": rows}
    run.note(f"evaluator output: `{folder}`")
    said = [f"{s.evaluator} {s.dataset} {s.metric} {s.score:g} ({s.completed + s.unparsed} of {s.dataset_size} "
            "answered)" for s in scores]  # fmt: skip
    return run.passed("; ".join(said))


def _absolute(path: str | None) -> str | None:
    return None if path is None else str(Path(path).resolve())
