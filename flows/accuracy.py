"""The accuracy stage: lm_eval and AISBench against the served endpoint, from local datasets.

Each score comes with its evaluator's version, the dataset's hash and the sample accounting
(completed, failed, missing, unparsed, of the dataset's size); it fails when samples were lost or a score is off its
baseline by more than the threshold. Not applicable until an evaluator is chosen. The evaluations
run under a watch of every rank (tasks/watch/liveness.py), as smoke and bench do.
"""

from dataclasses import asdict

from prefect import flow, runtime

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import AccuracyStageFailed
from k3deploy.core.paths import run_folder
from k3deploy.core.stage import StageResult
from k3deploy.tasks.accuracy.outcome import evaluator_settings, score_findings, summary
from k3deploy.tasks.accuracy.results import Score
from k3deploy.tasks.accuracy.steps import provision_evaluator, run_ais_bench, run_lm_eval
from k3deploy.tasks.endpoints import service_url
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.watch.liveness import watching


@flow(name="accuracy")
def accuracy(config: ConfigSource) -> StageResult:
    """Every chosen evaluator to a score with its samples accounted for."""
    cfg = resolve_config(config)
    settings = cfg.accuracy
    run = StageRun("accuracy", AccuracyStageFailed)
    if not settings.evaluators:
        return run.not_applicable("no evaluator chosen (accuracy.evaluators: lm_eval, ais_bench)")
    root = str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id)
    folder = (run_folder(root, "accuracy") / cfg.evidence_key()).resolve()
    scores: list[Score] = []
    with run.guard(), watching(cfg, "accuracy") as watch:
        lm, ais = evaluator_settings(settings)
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
            run.findings += [f for score in found for f in score_findings(name, score, chosen)]
            scores += found
    rows = [asdict(s) for s in scores]
    run.table("scores", rows, "scores with sample accounting (completed, failed, missing, unparsed)")
    run.data = {"folder": str(folder), "scores": rows}
    run.note(f"evaluator output: `{folder}`")
    return run.passed(summary(scores))
