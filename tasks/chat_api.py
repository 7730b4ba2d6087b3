"""The OpenAI-compatible chat API over HTTP, as the checks of the live service use it (smoke, conformance): a request,
its reply (a stream's raw SSE text), the SSE events of a stream, and the one function that sends a request.

Every request has its own timeout: a dead DP rank leaves its share of requests hanging while `/health` stays 200
(DESIGN.md), so a wait without one would never end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import httpx

CHAT = "/v1/chat/completions"
EXCERPT = 160


@dataclass(frozen=True)
class Call:
    method: Literal["GET", "POST"]
    path: str
    body: dict[str, Any] | None = None
    stream: bool = False
    request_id: str = ""  # sent as X-Request-Id: vLLM names the request by it in its own logs

    def headers(self) -> dict[str, str]:
        return {"X-Request-Id": self.request_id} if self.request_id else {}

    def excerpt(self) -> str:
        if self.body is None:
            return f"{self.method} {self.path}"
        return cut(f"{self.method} {self.path} {json.dumps(self.body)}")


@dataclass(frozen=True)
class Reply:
    """An answer (status and body text, a stream's raw SSE text), or status 0 and why there was none."""

    status: int
    text: str = ""
    error: str = ""

    def json(self) -> Any:
        try:
            return json.loads(self.text)
        except (ValueError, RecursionError):
            return None

    def why(self) -> str:
        """What went wrong, in words, when the status is not 200."""
        if self.status == 0:
            return self.error or "no answer"
        return f"HTTP {self.status}: {cut(self.text)}"


def cut(text: str, limit: int = EXCERPT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def stream_events(text: str) -> tuple[list[dict[str, Any]], bool]:
    """The JSON events of an SSE body and whether it ended with `data: [DONE]`."""
    events, done = [], False
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        try:
            event = json.loads(data)
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict):  # a chunk is an object; anything else is not one
            events.append(event)
    return events, done


def send(http: httpx.Client, call: Call, timeout: float) -> Reply:
    """One request; a stream is read to its end (its raw SSE text is the reply's text)."""
    try:
        if call.stream:
            sent = http.stream(call.method, call.path, json=call.body, headers=call.headers(), timeout=timeout)
            with sent as response:
                return Reply(response.status_code, "".join(response.iter_text()))
        response = http.request(call.method, call.path, json=call.body, headers=call.headers(), timeout=timeout)
        return Reply(response.status_code, response.text)
    except httpx.TimeoutException:
        return Reply(0, error=f"no answer within {timeout:g} s")
    except httpx.HTTPError as err:
        return Reply(0, error=f"{type(err).__name__}: {err}")
