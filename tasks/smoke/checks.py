"""Smoke checks as data, without I/O: each check yields the requests it needs and judges the replies.

A check is a generator: it yields a `Call` (one request) or a `Burst` (requests sent at once), is
sent back the `Reply` (or the list of replies), and returns an `Outcome`. The driver does the
HTTP; a test drives a check with recorded real replies. Adding a check touches `CHECKS` only.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from k3deploy.core.stage import FailureClass
from k3deploy.tasks import metrics
from k3deploy.tasks.chat_api import CHAT, Call, Reply, stream_events
from k3deploy.tasks.chat_api import cut as _cut
from k3deploy.tasks.tool_call import QUESTION, TOOL_RESULT, TOOLS

METRICS = "/metrics"


@dataclass(frozen=True)
class Burst:
    calls: list[Call]


@dataclass(frozen=True)
class Outcome:
    """ok None means not applicable (`detail` says why)."""

    ok: bool | None
    detail: str
    request: str = ""
    response: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    cause: FailureClass | None = None  # whose fault a failure is when the check knows (else the driver decides)


@dataclass(frozen=True)
class Context:
    """What the checks need to know about the service."""

    model: str
    vision: bool  # the served model declares image input
    prefix_caching: bool
    engines: dict[str, str]  # DP engine label ("0", "1", …) → the node that runs it
    burst: int = 8
    max_tokens: int = 32
    reasoning_max_tokens: int = 512
    nonce: str = ""  # leads the prefix-cache prompt, so its first send is one no cache can hold


CheckRun = Generator[Call | Burst, Any, Outcome]


@dataclass(frozen=True)
class Check:
    name: str
    what: str
    run: Callable[[Context], CheckRun]


def chat_body(ctx: Context, content: Any, *, thinking: bool, max_tokens: int | None = None) -> dict[str, Any]:
    return {
        "model": ctx.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens or ctx.max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"thinking": thinking},
    }


def first_choice(reply: Reply) -> tuple[dict[str, Any] | None, str]:
    """The first choice of a chat answer, or None and what is wrong with the answer."""
    if reply.status != 200:
        return None, reply.why()
    data = reply.json()
    if not isinstance(data, dict):
        return None, f"the answer is not JSON: {_cut(reply.text)}"
    choices = _list(data.get("choices"))
    if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        return None, f"no choice with a message: {_cut(reply.text)}"
    return choices[0], ""


def _list(value: Any) -> list[Any]:
    """A JSON field that should hold a list; [] when it holds anything else."""
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    """A JSON field that should hold text; '' when it holds anything else."""
    return value if isinstance(value, str) else ""


def reasoning_of(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """The parsed reasoning and the field it came in: `reasoning` (newer vLLM) or `reasoning_content`."""
    for name in ("reasoning", "reasoning_content"):
        if message.get(name):
            return str(message[name]), name
    return None, None


def png_data_url(size: int = 32, rgb: tuple[int, int, int] = (220, 30, 30)) -> str:
    """A solid-colour PNG made here (no image library): the image the image + text check sends."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(rgb) * size
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(row * size)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode()


# --------------------------------------------------------------------------- the checks


def check_chat(ctx: Context) -> CheckRun:
    call = Call("POST", CHAT, chat_body(ctx, "Say hello in one sentence.", thinking=False))
    reply = yield call
    choice, problem = first_choice(reply)
    if choice is None:
        return Outcome(False, problem, call.excerpt(), _cut(reply.text))
    text, finish = _text(choice["message"].get("content")), choice.get("finish_reason")
    if not text:
        return Outcome(False, f"no generated text (finish_reason {finish})", call.excerpt(), _cut(reply.text))
    if not finish:
        return Outcome(False, "no finish_reason", call.excerpt(), _cut(text))
    return Outcome(True, f"{len(text)} characters, finish_reason {finish}", call.excerpt(), _cut(text))


def check_streaming(ctx: Context) -> CheckRun:
    body = chat_body(ctx, "Say hello in one sentence.", thinking=False) | {"stream": True}
    call = Call("POST", CHAT, body, stream=True)
    reply = yield call
    if reply.status != 200:
        return Outcome(False, reply.why(), call.excerpt())
    events, done = stream_events(reply.text)
    deltas = [c.get("delta") for e in events for c in _list(e.get("choices")) if isinstance(c, dict)]
    text = "".join(str(d.get("content") or "") for d in deltas if isinstance(d, dict))
    if not events:
        return Outcome(False, "no chunks arrived", call.excerpt(), _cut(reply.text))
    if not done:
        return Outcome(False, f"{len(events)} chunks but no closing [DONE]", call.excerpt(), _cut(text))
    if not text:
        return Outcome(False, f"{len(events)} chunks that join to no text", call.excerpt(), _cut(reply.text))
    return Outcome(True, f"{len(events)} chunks joined to {len(text)} characters, [DONE]", call.excerpt(), _cut(text))


def check_image(ctx: Context) -> CheckRun:
    if not ctx.vision:
        return Outcome(None, "the served model declares no vision input (no vision_config in its config.json)")
    content = [
        {"type": "image_url", "image_url": {"url": png_data_url()}},
        {"type": "text", "text": "What colour is this image? Answer in one word."},
    ]
    call = Call("POST", CHAT, chat_body(ctx, content, thinking=False))
    reply = yield call
    choice, problem = first_choice(reply)
    if choice is None:
        return Outcome(False, problem, call.excerpt(), _cut(reply.text))
    text = _text(choice["message"].get("content"))
    if not text:
        return Outcome(False, "no text about the image", call.excerpt(), _cut(reply.text))
    return Outcome(True, f"answered {len(text)} characters", call.excerpt(), _cut(text))


def judge_tool_call(message: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The first tool call if it names a declared tool with arguments that parse and fit its schema."""
    calls = _list(message.get("tool_calls"))
    if not calls:
        return None, f"no tool_calls entry; content: {_cut(str(message.get('content')))}"
    function = calls[0].get("function") if isinstance(calls[0], dict) else None
    function = function if isinstance(function, dict) else {}
    declared = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    name = function.get("name")
    if not isinstance(name, str) or name not in declared:
        return None, f"called {name!r}, which the request never declared (declared: {', '.join(declared)})"
    try:
        arguments = json.loads(_text(function.get("arguments")))
    except (ValueError, RecursionError):
        return None, f"{name} arguments are not JSON: {_cut(str(function.get('arguments')))}"
    try:
        jsonschema.validate(arguments, declared[name])
    except jsonschema.ValidationError as err:
        return None, f"{name} arguments do not fit its schema: {err.message}"
    return calls[0], ""


def check_tool_call(ctx: Context) -> CheckRun:
    body = chat_body(ctx, QUESTION, thinking=True, max_tokens=ctx.reasoning_max_tokens)
    call = Call("POST", CHAT, body | {"tools": TOOLS, "tool_choice": "auto"})
    reply = yield call
    choice, problem = first_choice(reply)
    if choice is None:
        return Outcome(False, problem, call.excerpt(), _cut(reply.text))
    tool_call, problem = judge_tool_call(choice["message"])
    if tool_call is None:
        return Outcome(False, f"{problem} (finish_reason {choice.get('finish_reason')})", call.excerpt())
    function = tool_call["function"]
    messages = [
        *body["messages"],
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": tool_call.get("id", ""), "content": json.dumps(TOOL_RESULT)},
    ]
    follow = Call("POST", CHAT, body | {"messages": messages, "tools": TOOLS, "tool_choice": "auto"})
    second = yield follow
    answer, problem = first_choice(second)
    if answer is None:
        return Outcome(False, f"the turn with the tool result: {problem}", follow.excerpt(), _cut(second.text))
    said = answer["message"]
    if not (said.get("content") or said.get("tool_calls") or reasoning_of(said)[0]):
        return Outcome(False, "the turn with the tool result got an empty message", follow.excerpt())
    seen = f"{function['name']}({function['arguments']})"
    return Outcome(True, f"{seen}; the tool result was answered", call.excerpt(), _cut(seen))


def check_reasoning(ctx: Context) -> CheckRun:
    call = Call("POST", CHAT, chat_body(ctx, QUESTION, thinking=True, max_tokens=ctx.reasoning_max_tokens))
    reply = yield call
    choice, problem = first_choice(reply)
    if choice is None:
        return Outcome(False, problem, call.excerpt(), _cut(reply.text))
    message, finish = choice["message"], choice.get("finish_reason")
    reasoning, field_name = reasoning_of(message)
    content = _text(message.get("content"))
    if reasoning is None:
        return Outcome(False, f"no parsed reasoning (finish_reason {finish})", call.excerpt(), _cut(content))
    if not content and not message.get("tool_calls"):
        why = f"reasoning did not end within {ctx.reasoning_max_tokens} tokens" if finish == "length" else "no answer"
        return Outcome(False, f"{why}: nothing after the reasoning (finish_reason {finish})", call.excerpt())
    if reasoning.strip() in content:
        return Outcome(False, "the reasoning is repeated in the content", call.excerpt(), _cut(content))
    excerpt = _cut(f"{field_name}: {reasoning} | content: {content}")
    detail = f"reasoning in `{field_name}`, apart from the content"
    return Outcome(True, detail, call.excerpt(), excerpt, {"field": field_name})


def check_prefix_cache(ctx: Context) -> CheckRun:
    """A prompt of a little more than one cache block, new to the service (the context's nonce leads it), sent
    once cold and then as a cache hit on every engine: the hit must show in vllm:prefix_cache_hits_total, and the
    greedy answers must be the same tokens (vLLM-Ascend checks its prefix cache the same way: cached output equal
    to uncached). A different answer is the engine's fault, with both answers in the evidence."""
    if not ctx.prefix_caching:
        return Outcome(None, "prefix caching is off (serve.enable_prefix_caching false)")
    before = yield Call("GET", METRICS)
    if before.status != 200:
        return Outcome(False, f"/metrics: {before.why()}")
    sections = " ".join(f"Section {i}: the quick brown fox jumps over the lazy dog." for i in range(12))
    prompt = f"Run {ctx.nonce}. {sections}" if ctx.nonce else sections
    call = Call("POST", CHAT, chat_body(ctx, prompt, thinking=False))
    sends = len(ctx.engines) + 1  # each engine caches its own: one of them surely sees the prompt twice
    answers: list[str] = []
    for _ in range(sends):
        reply = yield call
        choice, problem = first_choice(reply)
        if choice is None:
            return Outcome(False, f"the long prompt: {problem}", call.excerpt())
        answers.append(_text(choice["message"].get("content")))
    after = yield Call("GET", METRICS)
    name = "vllm:prefix_cache_hits_total"
    hits = [metrics.total(metrics.parse(r.text), name) for r in (before, after)]
    if hits[1] is None:
        return Outcome(False, f"/metrics has no {name}", call.excerpt())
    rise = hits[1] - (hits[0] or 0.0)
    if rise <= 0:
        return Outcome(False, f"{name} did not rise over {sends} sends", call.excerpt())
    if (differs := next((a for a in answers[1:] if a != answers[0]), None)) is not None:
        return Outcome(False, f"the answer served from the prefix cache differs from the cold one: cold "
                       f"{_cut(answers[0], 120)!r}, cached {_cut(differs, 120)!r}", call.excerpt(),
                       _cut(differs), cause=FailureClass.ENGINE)  # fmt: skip
    detail = (f"{name} rose by {rise:g} tokens over {sends} sends of one {len(prompt)}-character prompt; "
              f"the cached answers equal the cold one ({len(answers[0])} characters)")  # fmt: skip
    return Outcome(True, detail, call.excerpt(), _cut(answers[0]))


def check_dp_ranks(ctx: Context) -> CheckRun:
    name = "vllm:request_success_total"
    before = yield Call("GET", METRICS)
    if before.status != 200:
        return Outcome(False, f"/metrics: {before.why()}")
    call = Call("POST", CHAT, chat_body(ctx, "Count to three.", thinking=False, max_tokens=4))
    replies = yield Burst([call] * ctx.burst)
    after = yield Call("GET", METRICS)
    finished = metrics.change(
        metrics.per_engine(metrics.parse(before.text), name), metrics.per_engine(metrics.parse(after.text), name)
    )
    failed = [r.why() for r in replies if r.status != 200]
    silent = [f"engine {e} ({node})" for e, node in ctx.engines.items() if finished.get(e, 0.0) <= 0]
    counts = ", ".join(f"engine {e}: {finished.get(e, 0.0):g}" for e in ctx.engines)
    data = {"finished_per_engine": {e: finished.get(e, 0.0) for e in ctx.engines}, "failed": len(failed)}
    problems = []
    if failed:
        problems.append(f"{len(failed)} of {ctx.burst} requests failed ({failed[0]})")
    if silent:
        problems.append(f"finished no request: {', '.join(silent)}")
    if problems:
        return Outcome(False, "; ".join(problems) + f" [{counts}]", call.excerpt(), data=data)
    return Outcome(True, f"{ctx.burst} requests answered; finished per engine: {counts}", call.excerpt(), data=data)


CHECKS: tuple[Check, ...] = (
    Check("chat", "HTTP 200, a choice, generated text, a finish reason", check_chat),
    Check("streaming", "chunks arrive, join to a message, end with [DONE]", check_streaming),
    Check("image + text", "an image sent as a data URL is answered", check_image),
    Check(
        "tool call",
        "tool_choice auto: a declared tool, arguments fitting its schema, the result answered",
        check_tool_call,
    ),
    Check("reasoning", "the reasoning parser keeps reasoning apart from the content", check_reasoning),
    Check(
        "prefix cache",
        "a new long prompt sent again raises vllm:prefix_cache_hits_total; cached answer = cold",
        check_prefix_cache,
    ),
    Check("every DP rank", "a burst of requests: each engine in /metrics finishes some", check_dp_ranks),
)
