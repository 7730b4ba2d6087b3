"""The conformance suite as data, without I/O: each case is one request and the judge of its answer.

Families (each a rule of the report, DESIGN.md "conformance"):
- forced: a forced call (`tool_choice` naming the function) to each corpus schema; the call's shape is the engine's
  (one call, the named function, a JSON object) and its arguments' validity against the schema is scored apart;
- auto: `tool_choice: auto` where a call is expected (the smoke exchange, with the tool list changing between cases);
- choice: `tool_choice` none and required, `response_format` json_schema and json_object (K3 feature contracts);
- reasoning: reasoning apart from the content, none in the content or in a call's arguments; none with thinking off;
- usage: `usage.prompt_tokens` equal to the count k3deploy makes with the served tokenizer and chat template, and
  `completion_tokens` equal to the tokens the answer listed (`return_token_ids`);
- params: malformed or out-of-range parameters answered HTTP 400, the tutorial's accepted.
Every case but the params' is sent streamed and not; the pairs must give the same answer (greedy sampling).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import jsonschema

from k3deploy.core.stage import FailureClass
from k3deploy.tasks.conformance.answers import Answer
from k3deploy.tasks.conformance.corpus import ToolSchema
from k3deploy.tasks.tool_call import DECOY_TOOL, QUESTION, TOOL_SCHEMA

MARKUP = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")  # K3 channel markers: never in parsed text
FORCED_FINISH = (
    "tool_calls",
    "stop",
)  # a named tool choice ends "stop" in OpenAI's API and vLLM's; "required" ends "tool_calls"
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


@dataclass(frozen=True)
class Verdict:
    """One case's judgement: ok, its status word (valid, invalid, no-call, …), whose fault, and why."""

    ok: bool
    status: str
    detail: str = ""
    cause: FailureClass | None = None
    keyword: str | None = None  # the JSON Schema keyword that failed, for an invalid call
    extra: dict[str, Any] = field(default_factory=dict)


Judge = Callable[[Answer], Verdict]


@dataclass(frozen=True)
class Case:
    id: str
    family: str
    body: dict[str, Any]
    judge: Judge
    stream: bool = False
    prompt_tokens: int | None = None  # the count k3deploy expects (usage family)

    @property
    def mode(self) -> str:
        return "streamed" if self.stream else "whole"

    def streamed(self) -> Case:
        body = self.body | {"stream": True, "stream_options": {"include_usage": True}}
        return replace(self, body=body, stream=True)


VALID = Verdict(True, "valid")


def _engine(status: str, detail: str) -> Verdict:
    return Verdict(False, status, detail, FailureClass.ENGINE)


def answered(answer: Answer) -> Verdict | None:
    """The failure when there is nothing to judge: an HTTP error, a broken stream."""
    if answer.problem:
        return _engine("http" if answer.status != 200 else "broken", answer.problem)
    return None


def call_shape(answer: Answer, allowed: list[str]) -> Verdict | None:
    """One call to a declared function, with a JSON object for arguments, or the engine's failure naming what."""
    if not answer.calls:
        return _engine("no-call", f"no tool call (finish_reason {answer.finish}); content {answer.content!r:.120}")
    if len(answer.calls) > 1:
        return _engine("several", f"{len(answer.calls)} calls where one was asked")
    call = answer.calls[0]
    if not call.name or not call.arguments:
        return _engine("empty", f"an empty tool call: name {call.name!r}, arguments {call.arguments!r}")
    if call.name not in allowed:
        return _engine("wrong-name", f"called {call.name!r}; asked {', '.join(allowed)}")
    try:
        arguments = json.loads(call.arguments)
    except (ValueError, RecursionError):
        return _engine("not-json", f"arguments are not JSON: {call.arguments[:120]!r}")
    if not isinstance(arguments, dict):
        return _engine("not-object", f"arguments are JSON but not an object: {call.arguments[:120]!r}")
    if answer.empty_deltas:
        return _engine("empty-delta", f"{answer.empty_deltas} streamed tool-call delta(s) carried nothing")
    return None


def schema_verdict(instance: Any, schema: dict[str, Any]) -> Verdict:
    """Valid, or invalid naming the keyword, the place and the message of the deepest first error."""
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is None:
        return VALID
    where = "/".join(str(p) for p in error.absolute_path) or "(top)"
    return Verdict(False, "invalid", f"{where}: {error.message[:160]} [{error.validator}]", FailureClass.MODEL,
                   keyword=str(error.validator))  # fmt: skip


def leaks(answer: Answer) -> str:
    """Channel markup left in the content (the parser's job to take out), or the reasoning repeated in the content or
    in a call's arguments. (Markup inside an argument's value is what the model wrote there, not a parser's leak.)"""
    content = answer.content or ""
    if marker := next((m for m in MARKUP if m in content), None):
        return f"{marker} in the content"
    places = [("content", content)] + [(f"{c.name} arguments", c.arguments) for c in answer.calls]
    for where, text in places:
        if answer.reasoning and len(answer.reasoning.strip()) >= 8 and answer.reasoning.strip() in text:
            return f"the reasoning is repeated in the {where}"
    return ""


# --------------------------------------------------------------------------- the families


def chat(model: str, content: str, max_tokens: int, *, thinking: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "chat_template_kwargs": {"thinking": thinking}} | extra  # fmt: skip


def forced(schema: ToolSchema, model: str, max_tokens: int, strict: bool) -> Case:
    tools = [schema.tool(strict)]
    body = chat(model, f"Call {schema.name} with arguments that fit its schema.", max_tokens, tools=tools,
                tool_choice={"type": "function", "function": {"name": schema.name}})  # fmt: skip

    def judge(answer: Answer) -> Verdict:
        broken = answered(answer) or call_shape(answer, [schema.name])
        if broken:
            return broken
        if answer.finish not in FORCED_FINISH:
            return _engine("finish", f"finish_reason {answer.finish!r} after the call (expected {FORCED_FINISH})")
        if leak := leaks(answer):
            return _engine("leak", leak)
        return schema_verdict(answer.calls[0].parsed(), schema.parameters)

    return Case(f"forced/{schema.name}", "forced", body, judge)


# The auto cases: the smoke exchange's question with a changing tool list (dynamic tools), the call always expected.
AUTO_TOOLSETS: dict[str, list[dict[str, Any]]] = {
    "alone": [TOOL_SCHEMA],
    "with-decoy": [TOOL_SCHEMA, DECOY_TOOL],
    "decoy-first": [DECOY_TOOL, TOOL_SCHEMA],
}


def auto(name: str, tools: list[dict[str, Any]], model: str, max_tokens: int) -> Case:
    declared = [t["function"]["name"] for t in tools]
    expected = TOOL_SCHEMA["function"]["name"]
    body = chat(model, QUESTION, max_tokens, tools=tools, tool_choice="auto")

    def judge(answer: Answer) -> Verdict:
        if broken := answered(answer):
            return broken
        if not answer.calls:
            return Verdict(False, "no-call", f"the model made no call (finish_reason {answer.finish}); content "
                           f"{answer.content!r:.120}", FailureClass.MODEL)  # fmt: skip
        if broken := call_shape(answer, declared):
            return broken
        if answer.finish != "tool_calls":
            return _engine("finish", f"finish_reason {answer.finish!r} after an automatic call (expected tool_calls)")
        if leak := leaks(answer):
            return _engine("leak", leak)
        call = answer.calls[0]
        if call.name != expected:
            return Verdict(False, "other-tool", f"called {call.name}, not {expected}", FailureClass.MODEL)
        parameters = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.name)
        return schema_verdict(call.parsed(), parameters)

    return Case(f"auto/{name}", "auto", body, judge)


def choice_cases(corpus: list[ToolSchema], model: str, max_tokens: int) -> list[Case]:
    """tool_choice none and required; response_format json_schema (a few corpus schemas) and json_object."""
    tools = [TOOL_SCHEMA, DECOY_TOOL]
    declared = [t["function"]["name"] for t in tools]

    def none_judge(answer: Answer) -> Verdict:
        if broken := answered(answer):
            return broken
        if answer.calls:
            return _engine("call", f"tool_choice none, yet {len(answer.calls)} call(s): {answer.calls[0].name}")
        return VALID if not leaks(answer) else _engine("leak", leaks(answer))

    def required_judge(answer: Answer) -> Verdict:
        broken = answered(answer) or call_shape(answer, declared)
        if broken:
            return broken
        parameters = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == answer.calls[0].name)
        return schema_verdict(answer.calls[0].parsed(), parameters)

    cases = [
        Case("choice/none", "choice", chat(model, QUESTION, max_tokens, tools=tools, tool_choice="none"), none_judge),
        Case("choice/required", "choice", chat(model, QUESTION, max_tokens, tools=tools, tool_choice="required"),
             required_judge),
    ]  # fmt: skip
    for schema in [s for s in corpus if s.parameters.get("required")][:4]:
        fmt = {"type": "json_schema", "json_schema": {"name": schema.name, "schema": schema.parameters}}
        body = chat(model, f"Answer with a JSON object for {schema.name}.", max_tokens, response_format=fmt)
        cases.append(Case(f"format/{schema.name}", "choice", body, _json_judge(schema.parameters)))
    body = chat(model, "Answer with a JSON object.", max_tokens, response_format={"type": "json_object"})
    cases.append(Case("format/json_object", "choice", body, _json_judge({"type": "object"})))
    return cases


def _json_judge(schema: dict[str, Any]) -> Judge:
    def judge(answer: Answer) -> Verdict:
        if broken := answered(answer):
            return broken
        if answer.finish == "length":
            return _engine("finish", f"the JSON did not end within max_tokens: {(answer.content or '')[:120]!r}")
        try:
            document = json.loads(answer.content or "")
        except (ValueError, RecursionError):
            return _engine("not-json", f"response_format asked JSON; content {(answer.content or '')[:120]!r}")
        verdict = schema_verdict(document, schema)
        # the engine's grammar enforces the schema itself here: an invalid document is the engine's
        return verdict if verdict.ok else replace(verdict, cause=FailureClass.ENGINE)

    return judge


def reasoning_cases(model: str, max_tokens: int) -> list[Case]:
    def on(answer: Answer) -> Verdict:
        if broken := answered(answer):
            return broken
        if not answer.reasoning:
            return _engine("no-reasoning", f"thinking on, no parsed reasoning; content {answer.content!r:.120}")
        if leak := leaks(answer):
            return _engine("leak", leak)
        return VALID

    def off(answer: Answer) -> Verdict:
        if broken := answered(answer):
            return broken
        if answer.reasoning:
            return _engine("reasoning", f"thinking off, yet reasoning {answer.reasoning!r:.120}")
        if leak := leaks(answer):
            return _engine("leak", leak)
        return VALID

    # reasoning_effort as K3 reads it (vLLM's renderers/kimi_k3.py): "none" turns thinking off, others set its effort
    effort = {k: v for k, v in chat(model, QUESTION, max_tokens).items() if k != "chat_template_kwargs"}
    return [
        Case("reasoning/thinking", "reasoning", chat(model, QUESTION, max_tokens), on),
        Case("reasoning/with-tools", "reasoning",
             chat(model, QUESTION, max_tokens, tools=[TOOL_SCHEMA], tool_choice="auto"), on),
        Case("reasoning/thinking-off", "reasoning", chat(model, QUESTION, max_tokens, thinking=False), off),
        Case("reasoning/effort high", "reasoning", effort | {"reasoning_effort": "high"}, on),
        Case("reasoning/effort none", "reasoning", effort | {"reasoning_effort": "none"}, off),
    ]  # fmt: skip


K3DEPLOY_COUNT = "the served tokenizer and chat template give"


def usage_case(case_id: str, body: dict[str, Any], expected: int, source: str = K3DEPLOY_COUNT) -> Case:
    """`source` says who counted `expected`: k3deploy itself, or the server's /tokenize where k3deploy cannot."""

    def judge(answer: Answer) -> Verdict:
        if broken := answered(answer):
            return broken
        usage = answer.usage or {}
        seen = usage.get("prompt_tokens")
        if seen != expected:
            off = f" ({seen - expected:+d})" if isinstance(seen, int) else ""
            return _engine("prompt-tokens", f"usage.prompt_tokens {seen}{off}; {source} {expected}")
        completion = usage.get("completion_tokens")
        if answer.token_ids is None:
            return _engine("no-token-ids", "the answer listed no token_ids (return_token_ids): completion unproven")
        if completion != answer.token_ids:
            return _engine("completion-tokens", f"usage.completion_tokens {completion}, tokens returned "
                           f"{answer.token_ids}")  # fmt: skip
        return Verdict(True, "valid", extra={"prompt_tokens": seen, "completion_tokens": completion})

    return Case(case_id, "usage", body | {"return_token_ids": True}, judge, prompt_tokens=expected)


def usage_bodies(model: str, max_tokens: int) -> dict[str, dict[str, Any]]:
    """The requests whose prompt tokens k3deploy counts itself: plain, thinking off, with tools, two turns."""
    two_turns = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hello! How can I help?"},
                 {"role": "user", "content": QUESTION}]  # fmt: skip
    return {
        "usage/plain": chat(model, "Explain why prefix caching helps repeated long prompts.", max_tokens),
        "usage/thinking-off": chat(model, "Say hello in one sentence.", max_tokens, thinking=False),
        "usage/tools": chat(model, QUESTION, max_tokens, tools=[TOOL_SCHEMA, DECOY_TOOL], tool_choice="auto"),
        "usage/two-turns": chat(model, QUESTION, max_tokens) | {"messages": two_turns},
    }


# Malformed or out-of-range requests, each answered HTTP 400 by a conforming server, and the tutorial's own request.
BAD_PARAMS: dict[str, dict[str, Any]] = {
    "temperature -1": {"temperature": -1},
    "top_p 1.5": {"top_p": 1.5},
    "max_tokens 0": {"max_tokens": 0},
    "max_tokens 'ten'": {"max_tokens": "ten"},
    "n 0": {"n": 0},
    "presence_penalty 3": {"presence_penalty": 3},
    "top_logprobs without logprobs 50": {"logprobs": True, "top_logprobs": 50},
    "messages not a list": {"messages": "hello"},
    "a message without a role": {"messages": [{"content": "hello"}]},
    "tool_choice names an undeclared tool": {"tools": [TOOL_SCHEMA],
                                             "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    "response_format of an unknown type": {"response_format": {"type": "yaml"}},
    "reasoning_effort 'extreme'": {"reasoning_effort": "extreme"},
    "thinking_effort 'extreme'": {"chat_template_kwargs": {"thinking": True, "thinking_effort": "extreme"}},
}  # fmt: skip


def params_cases(model: str, max_tokens: int) -> list[Case]:
    def refused(answer: Answer) -> Verdict:
        if answer.status == 400:
            return VALID
        if answer.status == 200:
            return _engine("accepted", "HTTP 200: the bad value was accepted (clamped or ignored), not refused")
        return _engine(f"http-{answer.status}", f"HTTP {answer.status} where 400 was due: {answer.problem[:160]}")

    def accepted(answer: Answer) -> Verdict:
        return VALID if answer.status == 200 else _engine(f"http-{answer.status}", answer.problem[:200])

    base = chat(model, "Explain why prefix caching helps repeated long prompts.", max_tokens)
    tutorial = {
        "model": model,
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Explain why prefix caching helps repeated long prompts."}],
    }
    cases = [Case(f"params/{name}", "params", base | change, refused) for name, change in BAD_PARAMS.items()]
    cases.append(Case("params/the tutorial's request", "params", tutorial, accepted))
    cases.append(Case("params/temperature 1.0, top_p 0.95", "params", base | {"temperature": 1.0, "top_p": 0.95,
                                                                            "seed": 7}, accepted))  # fmt: skip
    return cases
