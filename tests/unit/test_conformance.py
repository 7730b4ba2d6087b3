"""The conformance suite's pure parts: the corpus, the reassembly of real streams, the judges and the scorer.

The answers are real: vLLM 0.32 (CPU) serving the local profile's scripted checkpoint, recorded by
tests/data/conformance/record.py (docs/SOURCES.md). Each fault below is made from a real answer by changing the
one thing the rule is about, so a judge is shown failing on what it exists to catch and passing on the rest.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from k3deploy.localprofile.checkpoint import write_checkpoint
from k3deploy.tasks.chat_api import Reply
from k3deploy.tasks.conformance import cases as c
from k3deploy.tasks.conformance.answers import streamed, whole
from k3deploy.tasks.conformance.corpus import corpus, keywords
from k3deploy.tasks.conformance.prompt_tokens import PromptCounter, PromptCountError
from k3deploy.tasks.conformance.score import ALONE, LOAD, Limits, Result, differences, figures, score

pytestmark = pytest.mark.conformance

DATA = Path(__file__).parents[1] / "data" / "conformance" / "vllm-0.32.0.json"
RECORDED: dict[str, dict[str, Any]] = json.loads(DATA.read_text())
MODEL, TOKENS = "kimi-k3", 512
SCHEMAS = corpus()


def reply(key: str) -> Reply:
    return Reply(RECORDED[key]["status"], RECORDED[key]["text"])


def answer(case_id: str, mode: str):
    return (streamed if mode == "streamed" else whole)(reply(f"{case_id} {mode}"))


def edit_stream(key: str, change) -> Reply:
    """The recorded stream with `change(event)` applied to each JSON event (returning the new event or a list)."""
    out = []
    for line in RECORDED[key]["text"].splitlines():
        if line.startswith("data: {"):
            new = change(json.loads(line[6:]))
            for event in new if isinstance(new, list) else [new]:
                out.append("data: " + json.dumps(event))
        else:
            out.append(line)
    return Reply(200, "\n".join(out) + "\n")


# --------------------------------------------------------------------------- the corpus


def test_the_corpus_has_over_a_hundred_valid_schemas_each_with_a_valid_example_and_every_keyword():
    assert len(SCHEMAS) >= 100 and len({s.name for s in SCHEMAS}) == len(SCHEMAS)
    seen: set[str] = set()
    for schema in SCHEMAS:
        jsonschema.Draft202012Validator.check_schema(schema.parameters)
        assert c.schema_verdict(schema.example, schema.parameters).ok, schema.name
        seen |= keywords(schema.parameters)
    wanted = {"required", "properties", "additionalProperties", "items", "minItems", "maxItems", "uniqueItems", "enum",
              "const", "anyOf", "oneOf", "minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength", "pattern",
              "format"}  # fmt: skip
    assert wanted <= seen, wanted - seen
    assert {len(s.parameters.get("required", [])) for s in SCHEMAS} >= {0, 1, 2, 3}
    with pytest.raises(ValueError, match="120 schemas"):
        corpus(121)


# --------------------------------------------------------------------------- reassembly and judges, real answers


@pytest.mark.parametrize("case_id", ["forced/get_weather_000", "forced/book_flight_001", "auto/with-decoy",
                                     "reasoning/thinking", "reasoning/thinking-off", "choice/none",
                                     "format/json_object", "usage/tools"])  # fmt: skip
def test_a_real_stream_reassembles_to_the_real_whole_answer(case_id):
    one, other = answer(case_id, "whole"), answer(case_id, "streamed")
    assert not one.problem and not other.problem and other.done and other.chunks > 1
    assert one.same() == other.same()
    assert other.usage and other.usage["prompt_tokens"] == one.usage["prompt_tokens"]  # stream_options.include_usage
    if case_id.startswith("usage/"):  # return_token_ids: each chunk lists its tokens
        assert other.token_ids == other.usage["completion_tokens"] == one.token_ids


def test_real_forced_calls_are_judged_valid_and_invalid_naming_the_keyword():
    judge = {s.name: c.forced(s, MODEL, TOKENS, strict=True).judge for s in SCHEMAS}
    for mode in ("whole", "streamed"):
        ok = judge["get_weather_000"](answer("forced/get_weather_000", mode))
        assert (ok.ok, ok.status) == (True, "valid")
        missing = judge["book_flight_001"](answer("forced/book_flight_001", mode))
        assert (missing.ok, missing.status, missing.keyword, missing.cause) == (False, "invalid", "required", "model")
        assert "'origin' is a required property" in missing.detail
        nested = judge[SCHEMAS[4].name](answer(f"forced/{SCHEMAS[4].name}", mode))
        assert nested.status in ("valid", "invalid") and nested.cause != "engine", nested
        pattern = judge[SCHEMAS[51].name](answer(f"forced/{SCHEMAS[51].name}", mode))
        assert (pattern.status, pattern.keyword) == ("invalid", "pattern"), pattern  # a raw string: the model's


def test_real_auto_reasoning_choice_and_params_answers_pass_their_judges():
    for mode in ("whole", "streamed"):
        assert (
            c.auto("with-decoy", c.AUTO_TOOLSETS["with-decoy"], MODEL, TOKENS).judge(answer("auto/with-decoy", mode)).ok
        )
        for case in c.reasoning_cases(MODEL, TOKENS):
            assert case.judge(answer(case.id, mode)).ok, (case.id, mode)
        chosen = {k.id: k for k in c.choice_cases(SCHEMAS, MODEL, TOKENS)}
        for case_id in ("choice/none", "format/json_object"):
            assert chosen[case_id].judge(answer(case_id, mode)).ok, (case_id, mode)
    params = {k.id: k for k in c.params_cases(MODEL, TOKENS)}
    for case_id, word in (("params/temperature -1", "temperature"), ("params/thinking_effort 'extreme'", "low, high")):
        refused = whole(reply(f"{case_id} whole"))
        assert refused.status == 400 and word in refused.problem, refused.problem
        assert params[case_id].judge(refused).ok


@pytest.fixture(scope="module")
def counter(tmp_path_factory) -> PromptCounter:
    folder = tmp_path_factory.mktemp("ck")
    write_checkpoint(folder)
    return PromptCounter.from_files(
        (folder / "tokenizer.json").read_text(), (folder / "tokenizer_config.json").read_text()
    )


def test_the_prompt_count_k3deploy_makes_is_the_real_servers_usage(counter):
    body = RECORDED["usage/tools whole"]["body"]
    real = whole(reply("usage/tools whole")).usage["prompt_tokens"]
    assert counter.count(body) == real
    case = c.usage_case("usage/tools", body, counter.count(body))
    assert case.judge(whole(reply("usage/tools whole"))).ok
    assert case.streamed().judge(answer("usage/tools", "streamed")).ok
    with pytest.raises(PromptCountError, match="no chat_template"):
        PromptCounter.from_files(json.dumps(json.loads(counter.tokenizer.to_str())), "{}")


def test_a_served_tokenizer_k3deploy_cannot_count_fails_the_usage_cases_as_the_tools_naming_why():
    from k3deploy.blocks.loader import load_config
    from k3deploy.tasks.conformance.steps import build

    cfg = load_config(str(Path(__file__).parents[2] / "configs" / "local.yaml"))
    usage = [case for case in build(cfg, "k3deploy cannot count prompts: no chat_template") if case.family == "usage"]
    assert len(usage) == 8  # four prompts, whole and streamed
    verdict = usage[0].judge(whole(reply("usage/tools whole")))
    assert (verdict.ok, verdict.status, verdict.cause) == (
        False,
        "uncounted",
        "tool",
    ) and "chat_template" in verdict.detail


def test_with_neither_count_the_usage_rule_says_why_both_failed():
    from k3deploy.tasks.conformance.steps import expected_counts

    bodies = c.usage_bodies(MODEL, TOKENS)
    why = expected_counts("http://127.0.0.1:9", bodies, "k3deploy cannot read tokenizer.json", 5)
    assert isinstance(why, str) and why.startswith("k3deploy cannot read tokenizer.json; the server's /tokenize: ")


# --------------------------------------------------------------------------- each fault, made from a real answer


def test_an_empty_tool_call_delta_is_caught_in_a_real_stream():
    def add_empty(event):
        choices = event.get("choices") or []
        if choices and choices[0].get("delta", {}).get("tool_calls"):
            return [event | {"choices": [{"index": 0, "delta": {"tool_calls": []}}]}, event]
        return event

    broken = streamed(edit_stream("forced/get_weather_000 streamed", add_empty))
    verdict = c.forced(SCHEMAS[0], MODEL, TOKENS, strict=True).judge(broken)
    assert (verdict.ok, verdict.status, verdict.cause) == (False, "empty-delta", "engine")


def test_arguments_not_json_no_call_and_a_wrong_name_are_the_engines():
    judge = c.forced(SCHEMAS[0], MODEL, TOKENS, strict=True).judge
    good = answer("forced/get_weather_000", "whole")
    cut = type(good)(**{**good.__dict__, "calls": [type(good.calls[0])(good.calls[0].name, '{"city": ', "x")]})
    assert judge(cut).status == "not-json" and judge(cut).cause == "engine"
    none = type(good)(**{**good.__dict__, "calls": []})
    assert judge(none).status == "no-call"
    other = type(good)(**{**good.__dict__, "calls": [type(good.calls[0])("get_time", "{}", "x")]})
    assert judge(other).status == "wrong-name"


def test_prompt_tokens_off_by_one_fail_the_usage_rule(counter):
    body = RECORDED["usage/tools whole"]["body"]
    case = c.usage_case("usage/tools", body, counter.count(body))
    text = json.loads(RECORDED["usage/tools whole"]["text"])
    text["usage"]["prompt_tokens"] += 1
    verdict = case.judge(whole(Reply(200, json.dumps(text))))
    assert (verdict.ok, verdict.status) == (False, "prompt-tokens") and "(+1)" in verdict.detail


def test_a_500_on_a_bad_parameter_fails_and_a_clamped_one_too():
    case = {k.id: k for k in c.params_cases(MODEL, TOKENS)}["params/temperature -1"]
    assert case.judge(whole(Reply(500, '{"error": "boom"}'))).status == "http-500"
    assert case.judge(whole(reply("reasoning/thinking whole"))).status == "accepted"


def test_reasoning_leaking_into_the_content_is_caught():
    good = answer("reasoning/thinking", "whole")
    leaked = type(good)(**{**good.__dict__, "content": f"{good.reasoning} {good.content}"})
    case = c.reasoning_cases(MODEL, TOKENS)[0]
    assert case.judge(leaked).status == "leak" and "reasoning is repeated in the content" in case.judge(leaked).detail
    marked = type(good)(**{**good.__dict__, "content": f"{good.content}<|close|>message<|sep|>"})
    assert "<|close|> in the content" in case.judge(marked).detail


# --------------------------------------------------------------------------- the scorer


def result(case: str, mode: str, load: str, ok: bool = True, status: str = "valid", family: str = "forced",
           same: dict | None = None, cause: str | None = None) -> Result:  # fmt: skip
    return Result(case, family, mode, load, ok, status, "" if ok else f"{status}!", cause, None, 0.1, "", "",
                  same if same is not None else {"content": "x", "reasoning": "", "calls": []})  # fmt: skip


def test_a_failure_only_under_load_is_named_so_and_fails_its_rule():
    results = [result("forced/a", mode, ALONE) for mode in ("whole", "streamed")]
    results += [result("forced/a", "whole", LOAD),
                result("forced/a", "streamed", LOAD, False, "empty-delta", cause="engine")]  # fmt: skip
    rows = score(results, Limits())
    bad = {(r.rule, r.mode, r.load) for r in rows if not r.ok}
    assert ("forced calls well formed", "streamed", LOAD) in bad and ("empty tool calls", "", LOAD) in bad
    assert all(r.ok for r in rows if r.load == ALONE)
    row = next(r for r in rows if r.rule == "forced calls well formed" and not r.ok)
    assert "forced/a: empty-delta" in row.detail and "only under load" in row.detail
    assert figures(results, rows)["only_under_load"] == ["forced/a (streamed)"]


def test_schema_accuracy_is_held_to_its_threshold_per_mode_and_load():
    results = [result(f"forced/{i}", "whole", ALONE, i < 7, "valid" if i < 7 else "invalid", cause="model")
               for i in range(10)]  # fmt: skip
    assert not next(r for r in score(results, Limits()) if r.rule == "schema accuracy").ok
    row = next(r for r in score(results, Limits(schema_accuracy=0.7)) if r.rule == "schema accuracy")
    assert row.ok and "7/10 valid (70.0%)" in row.detail
    assert not next(r for r in score(results, Limits(schema_accuracy=0.71)) if r.rule == "schema accuracy").ok


def test_a_streamed_answer_that_differs_from_the_whole_one_is_a_failed_pair():
    results = [result("auto/x", "whole", ALONE, family="auto", same={"content": "a", "reasoning": "", "calls": []}),
               result("auto/x", "streamed", ALONE, family="auto",
                      same={"content": "a!", "reasoning": "", "calls": []})]  # fmt: skip
    [diff] = differences(results)
    assert diff.case == "auto/x" and "content differ" in diff.detail
    row = next(r for r in score(results, Limits()) if r.rule == "streamed = whole")
    assert not row.ok and "1 of 1 pairs differ" in row.detail
    assert next(r for r in score(results, Limits(max_stream_differences=1)) if r.rule == "streamed = whole").ok
