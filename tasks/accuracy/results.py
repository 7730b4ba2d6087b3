"""The evaluators' output files read into scores with sample accounting beside them (no I/O).

completed: samples with an answer; failed: requests that got none (AISBench keeps them in
`<dataset>_failed.jsonl`; lm_eval stops the whole run instead); missing: dataset samples with no
record at all; unparsed: answers the evaluator's extraction could not read (lm_eval's filter gives
`[invalid]`; AISBench leaves an empty prediction).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass
from typing import Any

from k3deploy.blocks.accuracy import Scoring
from k3deploy.errors import K3DeployError

INVALID = {"", "[invalid]"}


class UnreadableResults(K3DeployError, ValueError):
    """An evaluator's output is not what it writes; the message names the file's part and what is wrong."""


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

    @property
    def samples_ok(self) -> bool:
        return self.failed == 0 and self.missing == 0


def dataset_hash(files: dict[str, bytes]) -> str:
    """sha256 over the dataset's files (name and content, in name order): the same data gives the same hash."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return f"sha256:{digest.hexdigest()}"


def _jsonl(text: str, what: str) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as err:
                raise UnreadableResults(f"{what}, line {number}, is not JSON: {err}") from None
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _first_text(value: Any) -> str:
    """lm_eval's resps are [[text]] and filtered_resps [text]: the first text, or ''."""
    while isinstance(value, list):
        value = value[0] if value else ""
    return "" if value is None else str(value)


def lm_eval_scores(results_text: str, samples: dict[str, str], metric: str | None, data_hash: str) -> list[Score]:
    """One Score per task of a `results_*.json`, accounted from that task's `samples_<task>_*.jsonl` text."""
    try:
        results = json.loads(results_text)
    except (ValueError, RecursionError) as err:
        raise UnreadableResults(f"lm_eval results are not readable: {err}") from None
    per_task = results.get("results") if isinstance(results, dict) else None
    if not isinstance(per_task, dict):
        raise UnreadableResults("lm_eval results are not readable: no 'results' object")
    version = str(results.get("lm_eval_version", "?"))
    counts = results.get("n-samples")
    scores = []
    for task, figures in per_task.items():
        if not isinstance(figures, dict):
            raise UnreadableResults(f"lm_eval results for {task} are not an object: {str(figures)[:80]!r}")
        keys = [k for k in figures if "," in k and "_stderr" not in k and isinstance(figures[k], int | float)]
        key = metric if metric is not None else (keys[0] if keys else None)
        if key is None or key not in figures:
            raise UnreadableResults(f"lm_eval results for {task} have no metric {key!r} (they have {', '.join(keys)})")
        try:
            score = float(figures[key]) if isinstance(figures[key], int | float) else None
        except OverflowError:  # an integer beyond any float
            score = None
        if score is None:
            raise UnreadableResults(f"lm_eval results for {task}: {key} is {str(figures[key])[:80]!r}, not a score")
        rows = _jsonl(samples.get(task, ""), f"lm_eval samples of {task}")
        counted = counts.get(task) if isinstance(counts, dict) else None
        expected = counted.get("effective", len(rows)) if isinstance(counted, dict) else len(rows)
        if not isinstance(expected, int):
            raise UnreadableResults(f"lm_eval n-samples of {task}: effective is {str(expected)[:80]!r}, not a count")
        answered = [r for r in rows if _first_text(r.get("resps")).strip()]
        unparsed = sum(_first_text(r.get("filtered_resps")).strip() in INVALID for r in answered)
        scores.append(
            Score("lm_eval", version, task, data_hash, key, score, len(answered),
                  len(rows) - len(answered), max(0, expected - len(rows)), unparsed)
        )  # fmt: skip
    return scores


def ais_scores(
    summary_csv: str, predictions: dict[str, str], failures: dict[str, str], expected: dict[str, int],
    version: str, data_hash: str,
) -> list[Score]:  # fmt: skip
    """One Score per dataset row of AISBench's summary CSV (columns dataset, version, metric, mode, <model>)."""
    try:
        rows = [row for row in csv.reader(io.StringIO(summary_csv)) if row]  # a blank line reads as []
    except csv.Error as err:
        raise UnreadableResults(f"AISBench summary is not CSV: {err}") from None
    if len(rows) < 2 or rows[0][:4] != ["dataset", "version", "metric", "mode"] or len(rows[0]) < 5:
        raise UnreadableResults(f"AISBench summary is not the expected table: {summary_csv[:200]!r}")
    scores = []
    for row in rows[1:]:
        if len(row) < 5:
            raise UnreadableResults(f"AISBench summary row {row!r} has {len(row)} columns, not 5")
        dataset, metric, value = row[0], row[2], row[4]
        try:
            score = float(value)
        except ValueError:
            raise UnreadableResults(f"AISBench gave no score for {dataset}: {value!r}") from None
        done = _jsonl(predictions.get(dataset, ""), f"AISBench predictions of {dataset}")
        answered = [r for r in done if r.get("success", True)]
        failed = len(done) - len(answered) + len(_jsonl(failures.get(dataset, ""), f"AISBench failures of {dataset}"))
        unparsed = sum(not str(r.get("prediction") or "").strip() for r in answered)
        total = expected.get(dataset, len(answered) + failed)
        missing = max(0, total - len(answered) - failed)
        scores.append(Score("ais_bench", version, dataset, data_hash, metric, score, len(answered), failed, missing,
                            unparsed))  # fmt: skip
    return scores


def compare(score: Score, scoring: Scoring) -> tuple[bool, str] | None:
    """|score − baseline| ≤ threshold, or None when no baseline is set."""
    if scoring.baseline is None:
        return None
    distance = abs(score.score - scoring.baseline)
    rule = f"|{score.score:g} − {scoring.baseline:g}| = {distance:.4g} ≤ {scoring.threshold:g}"
    return distance <= scoring.threshold, rule
