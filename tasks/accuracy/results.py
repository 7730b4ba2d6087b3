"""The evaluators' output files read into scores with sample accounting beside them (no I/O).

Samples are counted against the dataset itself: completed (an answer the evaluator could read) +
unparsed (an answer its extraction could not read: lm_eval's filter gives `[invalid]`, AISBench
leaves an empty prediction) + failed (a request that got no answer: AISBench keeps them in
`<dataset>_failed.jsonl`; lm_eval stops the whole run instead) + missing (no record at all) = the
dataset's size. A sample recorded twice, a score that is NaN, a configured task or dataset the
output lacks: each is an unreadable result naming the file and what is wrong.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from k3deploy.blocks.accuracy import Scoring
from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks.evidence import figure, load_json_object

INVALID = {"", "[invalid]"}


@dataclass(frozen=True)
class Evidence:
    """A file an evaluator wrote: where it is (named in every error) and what it says."""

    path: str
    text: str


@dataclass(frozen=True)
class Score:
    evaluator: str
    version: str
    dataset: str
    dataset_hash: str
    metric: str
    score: float
    completed: int
    failed: int
    missing: int
    unparsed: int
    dataset_size: int  # completed + failed + missing + unparsed

    @property
    def samples_ok(self) -> bool:
        return self.failed == 0 and self.missing == 0


def dataset_hash(files: dict[str, bytes]) -> str:
    """sha256 over the dataset's files (name and content, in name order): the same data gives the same hash."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return f"sha256:{digest.hexdigest()}"


def count_lines(text: str) -> int:
    """A JSON Lines dataset's size: its non-blank lines."""
    return sum(1 for line in text.splitlines() if line.strip())


def _jsonl(file: Evidence) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(file.text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(load_json_object(line, f"line {number}"))
            except UnreadableEvidence as err:
                raise UnreadableEvidence(f"{file.path}: {err}") from None
    return rows


def _once(rows: list[dict[str, Any]], key: str, file: Evidence) -> None:
    twice = sorted((str(k) for k, n in Counter(str(r.get(key)) for r in rows).items() if n > 1))
    if twice:
        raise UnreadableEvidence(f"{file.path}: {key} {', '.join(twice)} recorded more than once")


def _accounted(
    evaluator: str, version: str, dataset: str, data_hash: str, metric: str, score: float,
    answered: list[str], failed: int, size: int, where: str,
) -> Score:  # fmt: skip
    unparsed = sum(text.strip() in INVALID for text in answered)
    recorded = len(answered) + failed
    if recorded > size:
        raise UnreadableEvidence(f"{where}: {recorded} samples recorded for {dataset}, which has {size}")
    return Score(evaluator, version, dataset, data_hash, metric, score, len(answered) - unparsed, failed,
                 size - recorded, unparsed, size)  # fmt: skip


def _first_text(value: Any) -> str:
    """lm_eval's resps are [[text]] and filtered_resps [text]: the first text, or ''."""
    while isinstance(value, list):
        value = value[0] if value else ""
    return "" if value is None else str(value)


def lm_eval_scores(
    results: Evidence, samples: dict[str, Evidence], tasks: list[str], sizes: dict[str, int], metric: str | None,
    data_hash: str,
) -> list[Score]:  # fmt: skip
    """One Score per configured task, from `results_*.json` and that task's `samples_<task>_*.jsonl`; a task's
    size is its dataset's (`sizes`), else what lm_eval says it took (n-samples)."""
    try:
        data = load_json_object(results.text, "the results")
    except UnreadableEvidence as err:
        raise UnreadableEvidence(f"{results.path}: {err}") from None
    per_task = data.get("results")
    if not isinstance(per_task, dict):
        raise UnreadableEvidence(f"{results.path}: no 'results' object")
    absent = [t for t in tasks if t not in per_task]
    if absent:
        raise UnreadableEvidence(f"{results.path}: no results for the configured task {', '.join(absent)} "
                                f"(it has {', '.join(per_task) or 'none'})")  # fmt: skip
    version = str(data.get("lm_eval_version", "?"))
    counted_by_tool = data.get("n-samples")
    counts: dict[str, Any] = counted_by_tool if isinstance(counted_by_tool, dict) else {}
    scores = []
    for task in tasks:
        figures = per_task[task]
        if not isinstance(figures, dict):
            raise UnreadableEvidence(f"{results.path}: results.{task} is {str(figures)[:80]!r}, not an object")
        keys = [k for k in figures if "," in k and "_stderr" not in k]
        key = metric if metric is not None else (keys[0] if keys else None)
        if key is None or key not in figures:
            raise UnreadableEvidence(f"{results.path}: results.{task} has no metric {key!r} "
                                    f"(it has {', '.join(keys) or 'none'})")  # fmt: skip
        try:
            score = figure(figures, key, f"results.{task}")
        except UnreadableEvidence as err:
            raise UnreadableEvidence(f"{results.path}: {err}") from None
        file = samples.get(task, Evidence(f"{results.path} (no samples_{task}_*.jsonl beside it)", ""))
        rows = _jsonl(file)
        _once(rows, "doc_id", file)
        size = sizes.get(task)
        if size is None:
            counted = counts.get(task)
            size = counted.get("effective") if isinstance(counted, dict) else None
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise UnreadableEvidence(f"{results.path}: n-samples.{task}.effective is {str(size)[:40]!r}, "
                                        "not a count, and the task's dataset is not known here")  # fmt: skip
        answered = [_first_text(r.get("filtered_resps")) for r in rows if _first_text(r.get("resps")).strip()]
        scores.append(_accounted("lm_eval", version, task, data_hash, key, score, answered, len(rows) - len(answered),
                                 size, file.path))  # fmt: skip
    return scores


def ais_scores(
    summary: Evidence, predictions: dict[str, Evidence], failures: dict[str, Evidence], sizes: dict[str, int],
    version: str, data_hash: str,
) -> list[Score]:  # fmt: skip
    """One Score per configured dataset (`sizes`: dataset → its size), from its row of AISBench's summary CSV
    (columns dataset, version, metric, mode, <model>) and its predictions."""
    try:
        rows = [row for row in csv.reader(io.StringIO(summary.text)) if row]  # a blank line reads as []
    except csv.Error as err:
        raise UnreadableEvidence(f"{summary.path}: not CSV: {err}") from None
    if len(rows) < 2 or rows[0][:4] != ["dataset", "version", "metric", "mode"] or len(rows[0]) < 5:
        raise UnreadableEvidence(f"{summary.path}: not the expected table: {summary.text[:200]!r}")
    by_dataset: dict[str, list[str]] = {}
    for row in rows[1:]:
        if len(row) < 5:
            raise UnreadableEvidence(f"{summary.path}: row {row!r} has {len(row)} columns, not 5")
        if row[0] in by_dataset:
            raise UnreadableEvidence(f"{summary.path}: dataset {row[0]} has more than one row")
        by_dataset[row[0]] = row
    scores = []
    for dataset, size in sizes.items():
        if dataset not in by_dataset:
            raise UnreadableEvidence(f"{summary.path}: no row for the configured dataset {dataset} "
                                    f"(it has {', '.join(by_dataset)})")  # fmt: skip
        metric, value = by_dataset[dataset][2], by_dataset[dataset][4]
        try:
            score = float(value)
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            raise UnreadableEvidence(f"{summary.path}: the score of {dataset} is {value!r}, not a finite number")
        done_file = predictions.get(dataset, Evidence(f"{summary.path} (no predictions of {dataset} beside it)", ""))
        failed_file = failures.get(dataset, Evidence(done_file.path, ""))
        done, failed = _jsonl(done_file), _jsonl(failed_file)
        _once(done, "id", done_file)
        _once(done + failed, "id", failed_file)
        answered = [str(r.get("prediction") or "") for r in done if r.get("success", True)]
        scores.append(_accounted("ais_bench", version, dataset, data_hash, metric, score, answered,
                                 len(done) - len(answered) + len(failed), size, done_file.path))  # fmt: skip
    return scores


def against_baseline(score: Score, scoring: Scoring) -> tuple[bool, str] | None:
    """|score − baseline| ≤ threshold, or None when no baseline is set."""
    if scoring.baseline is None:
        return None
    distance = abs(score.score - scoring.baseline)
    rule = f"|{score.score:g} − {scoring.baseline:g}| = {distance:.4g} ≤ {scoring.threshold:g}"
    return distance <= scoring.threshold, rule
