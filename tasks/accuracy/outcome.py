"""What the accuracy stage makes of its settings and scores (no I/O but the paths' existence)."""

from __future__ import annotations

from pathlib import Path

from k3deploy.blocks.accuracy import AccuracyConfig, AisBenchSettings, LmEvalSettings, Scoring
from k3deploy.core.errors import ConfigError
from k3deploy.core.stage import FailureClass, Finding
from k3deploy.tasks.accuracy.results import Score, against_baseline


def evaluator_settings(settings: AccuracyConfig) -> tuple[LmEvalSettings, AisBenchSettings]:
    """Both evaluators' settings with dataset paths taken from the folder k3deploy runs in (the evaluators
    run elsewhere); a chosen evaluator whose path is not there is a ConfigError naming the key."""
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
    return lm, ais


def score_findings(evaluator: str, score: Score, scoring: Scoring) -> list[Finding]:
    """Every sample accounted for (lost ones are the engine's when requests failed, else the tool's), and
    the score against its baseline when one is set."""
    subject = f"{evaluator} {score.dataset}"
    counts = f"{score.completed} completed, {score.failed} failed, {score.missing} missing"
    lost = None if score.samples_ok else FailureClass.ENGINE if score.failed else FailureClass.TOOL
    found = [Finding(subject, "samples", score.samples_ok,
                     f"{counts}, {score.unparsed} unparsed of {score.dataset_size}", lost)]  # fmt: skip
    verdict = against_baseline(score, scoring)
    if verdict is not None:
        found.append(Finding(subject, f"{score.metric} vs baseline", verdict[0], verdict[1]))
    return found


def summary(scores: list[Score]) -> str:
    return "; ".join(
        f"{s.evaluator} {s.dataset} {s.metric} {s.score:g} ({s.completed + s.unparsed} of {s.dataset_size} answered)"
        for s in scores
    )


def _absolute(path: str | None) -> str | None:
    return None if path is None else str(Path(path).resolve())
