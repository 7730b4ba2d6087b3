"""The stage contract's pure parts: the registry's selection, one majority rule, the run record and its schema."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import jsonschema
import pytest

from k3deploy.blocks import parse_config
from k3deploy.core.agreement import majority, split
from k3deploy.core.errors import LaunchStageFailed, StageFailed
from k3deploy.core.stage import Finding, StageResult, Verdict
from k3deploy.flows.registry import STAGES, select, stage
from k3deploy.records.record import (
    SCHEMA_PATH,
    RunRecord,
    build_record,
    json_schema,
    read_record,
    scan_records,
    write_record,
)
from k3deploy.tasks.models.checks import differing_nodes
from k3deploy.tasks.node.node_agent import Manifest
from tests.configs import site_data

pytestmark = pytest.mark.report


def names(stages) -> list[str]:
    return [s.name for s in stages]


def test_the_registry_lists_each_stage_once_and_validate_ends_with_teardown():
    assert names(STAGES) == [
        "preflight",
        "models",
        "comm",
        "image",
        "launch",
        "smoke",
        "conformance",
        "bench",
        "capacity",
        "soak",
        "accuracy",
        "teardown",
    ]
    assert names(select()) == [
        "preflight",
        "models",
        "comm",
        "image",
        "launch",
        "smoke",
        "conformance",
        "bench",
        "capacity",
        "soak",
        "accuracy",
    ]
    # preflight, launch, smoke and bench always run; conformance is kept by what shapes the served API's answers
    assert [s.name for s in STAGES if s.cached] == ["models", "comm", "image", "conformance"]


def test_a_retry_sends_the_conformance_suite_again_only_when_what_shapes_the_answers_changed():
    from k3deploy.tasks.stage_cache import inputs_digest

    data = site_data()
    base = parse_config(data).public()

    def digest(section: str, change: dict) -> str:
        changed = json.loads(json.dumps(data))
        changed[section] = {**changed.get(section, {}), **change}
        return inputs_digest(stage("conformance"), parse_config(changed).public(), {})

    same = inputs_digest(stage("conformance"), base, {})
    assert digest("bench", {"num_prompts": 7}) == digest("smoke", {"max_tokens": 9}) == same
    assert digest("serve", {"max_num_seqs": 7}) != same and digest("conformance", {"schemas": 7}) != same
    assert digest("image", {"allow_unpinned": True}) != same


def test_each_stage_option_is_one_field_of_the_model_taken_by_its_flow_and_by_validate_as_one_group():
    """The registry's StageOptions is the one list: the flows take its fields with its defaults, validate
    takes the model whole (one group in the UI's form), the CLI's flags show its descriptions."""
    import inspect

    from typer.main import get_command

    from k3deploy.cli.app import app
    from k3deploy.flows.registry import Stage, StageOptions
    from k3deploy.flows.validate import validate

    taken = [name for s in STAGES for name in s.options]
    assert sorted(taken) == sorted(StageOptions.model_fields)  # every field is some stage's, once
    for s in STAGES:
        parameters = inspect.signature(s.load().fn).parameters
        for name in (*s.options, *s.alone):
            assert name in parameters, f"{s.name}'s flow does not take {name}"
        for name in s.options:
            assert parameters[name].default == StageOptions.model_fields[name].default, (s.name, name)
    own = inspect.signature(validate.fn).parameters
    assert own["stages"].annotation in (StageOptions, "StageOptions") and not set(taken) & set(own)
    assert StageOptions(fresh=True).of(next(s for s in STAGES if s.name == "comm")) == {"fresh": True}
    with pytest.raises(ValueError, match=r"stage x: options \['nope'\] are not StageOptions fields"):
        Stage("x", "m:f", "x", options=("nope",))
    for command in ("run", "rerun"):
        shown = " ".join(p.help or "" for p in get_command(app).commands[command].params)  # type: ignore[attr-defined]
        for field in StageOptions.model_fields.values():
            assert field.description and field.description in shown, (command, field.description)


def test_only_and_from_still_start_with_preflight():
    assert names(select(only=["image"])) == ["preflight", "image"]
    assert names(select(only=["launch", "models"])) == ["preflight", "models", "launch"]
    assert names(select(start="image")) == [
        "preflight", "image", "launch", "smoke", "conformance", "bench", "capacity", "soak", "accuracy",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown stage 'report'"):
        select(only=["report"])
    with pytest.raises(ValueError, match="either only or from"):
        select(only=["image"], start="comm")
    with pytest.raises(ValueError, match="stages: preflight, models"):
        stage("report")


def test_one_majority_rule_none_on_a_tie():
    assert majority(["a", "a", "b"]) == "a"
    assert majority(["a", "b"]) is None and majority([]) is None
    assert split({"node0": "a", "node1": "b", "node2": "a"}) == "a on node0, node2; b on node1"


def test_models_with_no_majority_name_every_node_and_the_split():
    def manifest(commit: str) -> Manifest:
        return Manifest(repo="r", commit=commit, files={})

    out = differing_nodes({"node0": manifest("c1"), "node1": manifest("c2")}, [])
    assert set(out) == {"node0", "node1"}
    assert (
        out["node0"]
        == "no majority of nodes hold the same files: copy A (commit c1) on node0; copy B (commit c2) on node1"
    )
    assert differing_nodes({"n0": manifest("c1"), "n1": manifest("c1"), "n2": manifest("c2")}, []) == {
        "n2": "commit c2, the other nodes have c1"
    }


def test_a_stage_failure_carries_its_result_and_names_what_failed():
    result = StageResult(
        stage="launch",
        verdict=Verdict.FAIL,
        reason="node3 (DP rank 3): the container exited (status 0) during launch",
        findings=[Finding("node3 (DP rank 3)", "ready", False, "exited"), Finding("node0", "ready", True)],
    )
    err = LaunchStageFailed(result)
    assert isinstance(err, StageFailed) and err.result is result
    assert str(err).splitlines() == [
        "launch failed: node3 (DP rank 3): the container exited (status 0) during launch",
        "  node3 (DP rank 3): ready: exited",
    ]


def test_the_committed_schema_is_the_one_the_record_model_makes():
    assert json.loads(SCHEMA_PATH.read_text()) == json_schema(), "run `python3 -m k3deploy.records.record` to update it"


def record(run_id: str, verdict: Verdict, start: datetime) -> RunRecord:
    secrets = {"K3DEPLOY_HUB_TOKEN": "hf_record_sekrit", "K3DEPLOY_SSH_PRIVATE_KEY": "ssh-key-sekrit"}
    cfg = parse_config(site_data(), environ=secrets)
    stages = [
        StageResult(
            stage="preflight",
            verdict=Verdict.PASS,
            data={"nodes": {"node0": {"os": "Debian"}}, "host_keys": {"node0": "SHA256:abc"}},
            started_at=start,
            ended_at=start + timedelta(seconds=2),
        ),
        StageResult(
            stage="models",
            verdict=verdict,
            findings=[Finding("target", "files", verdict is Verdict.PASS, "node1: sha256 mismatch")],
            data={
                "checkpoints": [
                    {"role": "target", "repo": "o/k3", "commit": "c" * 40, "path": "/m/k3", "files": 3, "bytes": 9}
                ]
            },
        ),
    ]
    return build_record(run_id, "brave-otter", cfg, stages, start, start + timedelta(seconds=30))


def test_a_record_fits_the_schema_keeps_provenance_and_no_secret(tmp_path):
    start = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    rec = record("3f2a-run", Verdict.FAIL, start)
    path = write_record(rec, tmp_path)
    text = path.read_text()
    document = json.loads(text)
    jsonschema.validate(document, json.loads(SCHEMA_PATH.read_text()))
    assert document["verdict"] == "fail" and document["failed_stage"] == "models"
    assert document["node_facts"] == {"node0": {"os": "Debian"}} and document["host_keys"]["node0"] == "SHA256:abc"
    assert document["checkpoints"][0]["commit"] == "c" * 40
    assert (
        document["config"]["models"]["hub_token"] is None
        and document["config"]["cluster"]["ssh"]["private_key"] is None
    )
    assert "sekrit" not in text and "**********" not in text
    assert read_record("3f2a", tmp_path) == rec  # a unique prefix is enough


def test_runs_are_listed_newest_first_and_an_ambiguous_prefix_is_refused(tmp_path):
    start = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    write_record(record("aa-1", Verdict.PASS, start), tmp_path)
    write_record(record("aa-2", Verdict.PASS, start + timedelta(hours=1)), tmp_path)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "record.json").write_text("{not json")
    scan = scan_records(tmp_path)
    assert [r.run_id for r in scan.records] == ["aa-2", "aa-1"]
    assert [str(u) for u in scan.unreadable] == [f"{tmp_path}/broken/record.json: not JSON (cut short?): "
                                                 "Expecting property name enclosed in double quotes: line 1 column 2 "
                                                 "(char 1)"]  # fmt: skip
    with pytest.raises(Exception, match="'aa' matches 2 runs"):
        read_record("aa", tmp_path)


def test_cluster_time_is_wall_time_times_nodes_and_a_reuse_counts_what_it_saved():
    from rich.console import Console

    from k3deploy.cli.output import print_record
    from k3deploy.core.stage import held, now
    from k3deploy.records.report import markdown

    start = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
    ran = StageResult(stage="models", verdict=Verdict.PASS, started_at=start, ended_at=start + timedelta(seconds=900))
    began = now() - timedelta(seconds=10)
    spent = held(ran, 4, began, reused=False)
    assert spent.saved_node_seconds == 0 and 40 <= spent.node_seconds < 40 + 4 * 60  # ~10 s here × 4 nodes
    reused = held(ran, 4, now(), reused=True)  # the earlier attempt's 900 s on 4 nodes, not spent again
    assert reused.saved_node_seconds == 3600 and reused.node_seconds < 4 * 60
    assert held(spent, 4, now(), reused=True).saved_node_seconds == spent.node_seconds  # its own count first

    cfg = parse_config(site_data())
    stages = [reused.model_copy(update={"node_seconds": 2.0}), spent.model_copy(update={"node_seconds": 5400.0})]
    rec = build_record("run-t", None, cfg, stages, start, start + timedelta(hours=1))
    assert (rec.cluster_hours, rec.saved_cluster_hours) == (round(5402 / 3600, 4), 1.0)
    assert rec.cluster_time() == "cluster time: 1.501 node-hours (1 saved by reusing stages that passed)"
    console = Console(width=200, record=True)
    print_record(console, rec)
    shown = console.export_text()
    assert "node·s" in shown and "2 (3600 reused)" in shown and "5400" in shown and rec.cluster_time() in shown
    assert rec.cluster_time() + "." in markdown(rec, None, {})
