"""The bisect's pure parts: suspects, the experiment configs, the judgement of an experiment, the search,
and the record's schema. The two records are real local-profile runs (tests/data/bisect/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.core.errors import K3DeployError
from k3deploy.core.stage import FailureCause, FailureClass
from k3deploy.records.bisect_record import BISECT_SCHEMA_PATH, BisectRecord, bisect_html, bisect_markdown, json_schema
from k3deploy.records.bisect_search import (
    BisectVerdict,
    Need,
    Outcome,
    Target,
    compose,
    experiment_config,
    judge_experiment,
    next_step,
    reused_pass,
    suspects,
    target_of,
    way_to_bad,
)
from k3deploy.records.record import ImageProvenance, RunRecord, load_record

DATA = Path(__file__).parents[1] / "data" / "bisect"
GOOD = load_record(DATA / "max_num_seqs-4.record.json")
BAD = load_record(DATA / "max_num_seqs-1.record.json")
TTFT = "bench random c2 mean_ttft_ms"
THROUGHPUT = "bench random c2 output_throughput"


def edited(record: RunRecord, **changes: object) -> RunRecord:
    config = json.loads(json.dumps(record.config))
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = config
        for part in path:
            node = node[part]
        node[last] = value
    return record.model_copy(update={"config": config})


def test_each_changed_key_is_a_suspect_and_the_image_keys_are_one():
    bad = edited(
        BAD, serve__readiness__poll_s=1, image__ref="k3deploy/vllm-cpu:next", image__digest="sha256:" + "a" * 64
    )
    found, fixed = suspects(GOOD, bad)
    assert [(s.name, s.kind.value) for s in found] == [
        ("image", "image"),
        ("serve.max_num_seqs", "config"),
        ("serve.readiness.poll_s", "config"),
    ]
    image = found[0]
    assert image.good == {"image.ref": "k3deploy/vllm-cpu:local", "image.digest": None}
    assert image.bad["image.digest"] == "sha256:" + "a" * 64
    assert found[1].describe() == "serve.max_num_seqs: 4 → 1"
    assert fixed == []  # free space and ports moved between the runs: node state, not a difference to name


def test_family_keys_and_credentials_are_never_suspects_and_node_facts_are_named_as_fixed():
    bad = edited(BAD, bench__num_prompts=99, models__hub_token="x")
    facts = {node: facts | {"driver": "24.1.rc3"} for node, facts in bad.node_facts.items()}
    found, fixed = suspects(GOOD, bad.model_copy(update={"node_facts": facts}))
    assert [s.name for s in found] == ["serve.max_num_seqs"]
    assert fixed == ["node local0 driver: (none) → 24.1.rc3", "node local1 driver: (none) → 24.1.rc3"]


def test_a_moved_tag_under_the_same_config_pins_each_ends_digest():
    def with_digest(record: RunRecord, digest: str) -> RunRecord:
        image = ImageProvenance(ref="r:t", image_id="sha256:" + digest[0] * 64, digest="sha256:" + digest * 64)
        return record.model_copy(update={"image": image})

    (image, _seqs), _ = suspects(with_digest(GOOD, "1"), with_digest(BAD, "2"))
    assert (image.name, image.good, image.bad) == ("image", {"image.digest": "sha256:" + "1" * 64},
                                                   {"image.digest": "sha256:" + "2" * 64})  # fmt: skip


def test_an_experiment_takes_the_applied_suspects_from_the_bad_end_and_the_rest_from_the_good_end():
    bad = edited(BAD, serve__readiness__poll_s=1)
    found, _ = suspects(GOOD, bad)
    mixed = compose(bad.config, found, {"serve.max_num_seqs"})
    assert mixed["serve"]["max_num_seqs"] == 1 and mixed["serve"]["readiness"]["poll_s"] == 2
    assert compose(bad.config, found, set())["serve"] == GOOD.config["serve"]
    assert compose(bad.config, found, {s.name for s in found}) == bad.config
    assert experiment_config(mixed, None).serve.max_num_seqs == 1  # a config that validates


def test_the_target_is_the_regressed_figure_that_moved_most():
    target = target_of(GOOD, BAD, [THROUGHPUT, TTFT])
    assert (target.key, target.stage, target.higher_is_better) == (TTFT, "bench", False)
    assert target.good == pytest.approx(61.32, abs=0.01) and target.bad == pytest.approx(171.4, abs=0.1)
    assert target_of(GOOD, BAD, [THROUGHPUT]).key == THROUGHPUT
    with pytest.raises(K3DeployError, match="nothing to bisect"):
        target_of(GOOD, BAD, [])


def test_an_experiment_is_judged_by_the_side_of_the_midpoint_its_figure_falls_on():
    target = target_of(GOOD, BAD, [TTFT])
    like_bad, like_good = judge_experiment(target, BAD), judge_experiment(target, GOOD)
    assert like_bad.reproduces is True and like_bad.value == target.bad
    assert like_good.reproduces is False and "0% of the way to the bad end" in like_good.evidence
    assert like_bad.spread == []  # one repeat: no spread to show


def test_a_timing_is_judged_by_its_factor_so_a_busier_machine_scaling_both_sides_does_not_flip_it():
    """ci11: good run 116.5 ms, bad run 2602 ms (mean TTFT behind max_num_seqs 1), the bad end run again on a
    busier machine 1264 ms: 46 % of the way linearly, but 76 % by factor, the bad end's side."""
    for value, bad_side in ((1264.0, True), (800.0, True), (2602.0, True), (95.7, False), (300.0, False)):
        assert (way_to_bad(value, 116.5, 2602.0) > 0.5) is bad_side, value
    assert round(way_to_bad(1264.0, 116.5, 2602.0), 2) == 0.77
    assert way_to_bad(100.0, 800.0, 50.0) > 0.5 and way_to_bad(600.0, 800.0, 50.0) < 0.5  # throughput falls
    assert way_to_bad(0.2, 0.0, 1.0) == pytest.approx(0.2)  # an end at zero: linear


def test_a_failure_reproduces_only_at_the_same_stage_with_the_same_class():
    engine = FailureCause(failure_class=FailureClass.ENGINE, evidence="ValueError: max_model_len")
    failed = BAD.model_copy(update={"verdict": "fail", "failed_stage": "launch", "failure": engine})
    target = target_of(GOOD, failed, [])
    assert target == Target(kind="failure", key="launch", stage="launch", failure_class=FailureClass.ENGINE)
    assert judge_experiment(target, failed).reproduces is True
    assert judge_experiment(target, GOOD).reproduces is False
    infra = FailureCause(failure_class=FailureClass.INFRASTRUCTURE, evidence="node down")
    elsewhere = failed.model_copy(update={"failed_stage": "models", "failure": infra})
    assert judge_experiment(target, elsewhere).reproduces is None
    failed_bench = GOOD.model_copy(update={"verdict": "fail", "failed_stage": "bench", "failure": infra})
    assert judge_experiment(target_of(GOOD, BAD, [TTFT]), failed_bench).reproduces is None


FIGURE = Target(kind="figure", key=TTFT, stage="bench", higher_is_better=False, good=1.0, bad=2.0)


def search(names: list[str], culprits: set[frozenset[str]], budget: int = 20) -> tuple[Outcome, list[frozenset]]:
    """Run the search to its end against an oracle: a set reproduces when it holds one of `culprits`."""
    done: dict[frozenset[str], bool | None] = {}
    while isinstance(step := next_step(names, done, budget, FIGURE), Need):
        assert step.applied not in done  # never the same experiment twice
        done[step.applied] = any(c <= step.applied for c in culprits)
    return step, list(done)


def test_both_ends_are_run_again_first_then_a_single_culprit_is_found():
    outcome, order = search(["a", "b"], {frozenset({"b"})})
    assert order[:2] == [frozenset({"a", "b"}), frozenset()]  # the bad end re-confirmed, the good end re-run
    assert (outcome.verdict, outcome.culprits) == (BisectVerdict.CULPRIT, ["b"])
    assert len(order) == 4
    outcome, order = search(["a", "b"], {frozenset({"a"})})
    assert (outcome.verdict, outcome.culprits, len(order)) == (BisectVerdict.CULPRIT, ["a"], 3)


def test_one_of_eight_takes_a_logarithmic_number_of_experiments():
    names = [f"k{i}" for i in range(8)]
    outcome, order = search(names, {frozenset({"k5"})})
    assert (outcome.verdict, outcome.culprits) == (BisectVerdict.CULPRIT, ["k5"])
    assert len(order) <= 2 + 2 * 3


def test_two_keys_that_only_together_reproduce_it_are_an_interaction():
    outcome, _ = search(["a", "b", "c"], {frozenset({"a", "c"})})
    assert (outcome.verdict, outcome.culprits) == (BisectVerdict.INTERACTION, ["a", "c"])


def test_an_end_that_does_not_hold_up_makes_it_not_reproducible():
    done = {frozenset({"a"}): False}
    outcome = next_step(["a"], done, 8, FIGURE)
    assert isinstance(outcome, Outcome) and outcome.verdict is BisectVerdict.NOT_REPRODUCIBLE
    assert "the bad end, run again, does not reproduce" in outcome.reason
    outcome = next_step(["a"], {frozenset({"a"}): True, frozenset(): True}, 8, FIGURE)
    assert isinstance(outcome, Outcome) and "the good end, run again, reproduces it too" in outcome.reason
    unresolved = next_step(["a"], {frozenset({"a"}): None}, 8, FIGURE)  # a bad end that failed otherwise
    assert isinstance(unresolved, Outcome) and unresolved.verdict is BisectVerdict.NOT_REPRODUCIBLE


def test_the_budget_stops_it_undecided_with_the_smallest_set_so_far():
    outcome, order = search(["a", "b", "c", "d"], {frozenset({"d"})}, budget=4)
    assert len(order) == 4
    assert outcome.verdict is BisectVerdict.UNDECIDED and "budget of 4 experiments" in outcome.reason
    assert outcome.culprits == ["c", "d"]


def test_the_bisect_schema_in_the_repo_is_current_and_a_record_reads_back():
    assert json.loads(BISECT_SCHEMA_PATH.read_text()) == json_schema()
    outcome = Outcome(verdict=BisectVerdict.CULPRIT, culprits=["serve.max_num_seqs"], reason="it alone")
    found, _ = suspects(GOOD, BAD)
    target = target_of(GOOD, BAD, [TTFT])
    record = BisectRecord(bisect_id="b1", bad_run=BAD.run_id, good_run=GOOD.run_id, started_at=BAD.started_at,
                          max_experiments=8, target=target, suspects=found, outcome=outcome)  # fmt: skip
    again = BisectRecord.model_validate_json(record.model_dump_json())
    assert again == record
    assert "**culprit: serve.max_num_seqs — it alone**" in bisect_markdown(again)


def test_the_report_section_of_a_bisect_escapes_what_it_quotes_and_lists_suspects_and_verdict():
    outcome = Outcome(verdict=BisectVerdict.CULPRIT, culprits=["serve.max_num_seqs"], reason="<it> alone & only")
    found, _ = suspects(GOOD, BAD)
    record = BisectRecord(bisect_id="b1", bad_run=BAD.run_id, good_run=GOOD.run_id, started_at=BAD.started_at,
                          max_experiments=8, target=target_of(GOOD, BAD, [TTFT]), suspects=found, outcome=outcome,
                          fixed=["image <digest>"])  # fmt: skip
    section = bisect_html(record)
    assert section.startswith("<section id='bisect-b1'><h2>Bisect b1</h2>") and section.endswith("</section>")
    assert "culprit: serve.max_num_seqs — &lt;it&gt; alone &amp; only" in section and "<it>" not in section
    assert all(f"<li>{s.name} (" in section for s in found) and "<li>image &lt;digest&gt;</li>" in section
    assert f"last pass {GOOD.run_id}." in section and section.count("<th>") == 5


def test_a_cached_stage_is_reused_from_an_end_that_passed_it_with_the_same_inputs():
    from k3deploy.flows.registry import BY_NAME

    options = {"download": True, "full_verify": False, "fresh": False}
    cfg = experiment_config(BAD.config, None)
    for name in ("models", "comm", "image"):  # max_num_seqs is none of theirs: the good end's pass serves
        end, result = reused_pass(BY_NAME[name], cfg, [GOOD, BAD], options) or ("", None)
        assert end == GOOD.run_id and result is not None and result.node_seconds == 0
        assert result.saved_node_seconds == GOOD.stage(name).node_seconds > 0
    moved = experiment_config(edited(BAD, image__ref="k3deploy/vllm-cpu:next").config, None)
    assert reused_pass(BY_NAME["image"], moved, [GOOD, BAD], options) is None  # what the image stage reads changed
    assert reused_pass(BY_NAME["models"], moved, [GOOD, BAD], options) is not None
    failed = GOOD.model_copy(update={"stages": [s.model_copy(update={"verdict": "fail"}) for s in GOOD.stages]})
    assert reused_pass(BY_NAME["models"], cfg, [failed], options) is None  # only a pass is reused
