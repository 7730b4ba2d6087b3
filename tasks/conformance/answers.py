"""A chat answer in one shape whether it came whole or streamed: the stream's deltas put back together as an
OpenAI client does (content and reasoning joined, tool calls gathered by `index`: id and name once, `arguments`
joined), with what a stream can get wrong and a whole answer cannot (a delta with an empty tool call).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from k3deploy.tasks.chat_api import Reply, stream_events


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str
    id: str = ""

    def parsed(self) -> Any:
        """The arguments as JSON, or the raw text when they are not JSON (so a comparison still sees them)."""
        try:
            return json.loads(self.arguments)
        except (ValueError, RecursionError):
            return self.arguments


@dataclass
class Answer:
    """What one request got back. `problem` is set when there is no answer to judge (HTTP error, no choice)."""

    status: int
    content: str | None = None
    reasoning: str | None = None
    calls: list[Call] = field(default_factory=list)
    finish: str | None = None
    usage: dict[str, Any] | None = None
    token_ids: int | None = None  # generated tokens the server listed (return_token_ids), when it did
    empty_deltas: int = 0  # streamed tool-call deltas that carried nothing: no id, no name, no arguments
    chunks: int = 0
    done: bool = True  # a stream ended with [DONE]
    problem: str = ""

    def same(self) -> dict[str, Any]:
        """What must be equal streamed and not, with greedy sampling: text, reasoning, calls (their ids are random)."""
        return {"content": self.content or "", "reasoning": self.reasoning or "",
                "calls": [(c.name, c.parsed()) for c in self.calls]}  # fmt: skip

    def excerpt(self, limit: int = 240) -> str:
        if self.problem:
            return self.problem[:limit]
        calls = ", ".join(f"{c.name}({c.arguments})" for c in self.calls)
        parts = [f"finish_reason {self.finish}"]
        parts += [f"reasoning {self.reasoning!r}"] if self.reasoning else []
        parts += [f"content {self.content!r}"] if self.content else []
        parts += [f"tool_calls {calls}"] if self.calls else []
        text = "; ".join(parts)
        return text if len(text) <= limit else text[: limit - 1] + "…"


def _dict(value: Any) -> dict[str, Any]:
    """A JSON field that should hold an object; {} when it holds anything else."""
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value != "" else None


def _reasoning(message: dict[str, Any]) -> str | None:
    return _text(message.get("reasoning")) or _text(message.get("reasoning_content"))


def whole(reply: Reply) -> Answer:
    """A non-streamed chat answer."""
    if reply.status != 200:
        return Answer(reply.status, problem=reply.why())
    data = reply.json()
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Answer(reply.status, problem=f"no choice in the answer: {reply.text[:200]}")
    choice = choices[0]
    message = _dict(choice.get("message"))
    calls = []
    for raw in message.get("tool_calls") or []:
        part = _dict(raw)
        function = _dict(part.get("function"))
        calls.append(
            Call(str(function.get("name") or ""), str(function.get("arguments") or ""), str(part.get("id", "")))
        )
    ids = choice.get("token_ids")
    return Answer(
        reply.status,
        content=_text(message.get("content")),
        reasoning=_reasoning(message),
        calls=calls,
        finish=choice.get("finish_reason"),
        usage=data.get("usage") if isinstance(data.get("usage"), dict) else None,
        token_ids=len(ids) if isinstance(ids, list) else None,
    )


def streamed(reply: Reply) -> Answer:
    """A streamed chat answer, its deltas reassembled; the usage chunk (stream_options.include_usage) kept."""
    if reply.status != 200:
        return Answer(reply.status, problem=reply.why())
    events, done = stream_events(reply.text)
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    answer = Answer(reply.status, chunks=len(events), done=done)
    token_ids = None
    for event in events:
        if isinstance(event.get("error"), dict):
            answer.problem = f"an error in the stream: {json.dumps(event['error'])[:200]}"
        if isinstance(event.get("usage"), dict):
            answer.usage = event["usage"]
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if isinstance(choice.get("token_ids"), list):
                token_ids = (token_ids or 0) + len(choice["token_ids"])
            if choice.get("finish_reason"):
                answer.finish = choice["finish_reason"]
            delta = _dict(choice.get("delta"))
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning") or delta.get("reasoning_content") or "")
            if "tool_calls" in delta:
                answer.empty_deltas += _gather(delta.get("tool_calls"), calls)
    answer.content = _text("".join(content))
    answer.reasoning = _text("".join(reasoning))
    answer.calls = [Call(c["name"], c["arguments"], c["id"]) for _, c in sorted(calls.items())]
    answer.token_ids = token_ids
    if not events and not answer.problem:
        answer.problem = "no chunks arrived"
    elif not done and not answer.problem:
        answer.problem = f"{len(events)} chunks but no closing [DONE]"
    return answer


def _gather(deltas: Any, calls: dict[int, dict[str, str]]) -> int:
    """Fold one delta's tool-call parts into `calls`; the number of parts (or the list itself) that were empty."""
    if not isinstance(deltas, list) or not deltas:
        return 1
    empty = 0
    for part in deltas:
        if not isinstance(part, dict):
            empty += 1
            continue
        function = _dict(part.get("function"))
        name, arguments = function.get("name") or "", function.get("arguments") or ""
        if not (part.get("id") or name or arguments):
            empty += 1
            continue
        index = part.get("index", 0) if isinstance(part.get("index", 0), int) else 0
        call = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
        call["id"] = call["id"] or str(part.get("id") or "")
        call["name"] += str(name)
        call["arguments"] += str(arguments)
    return empty
