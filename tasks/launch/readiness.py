"""Is the service ready: /health, /v1/models, a real chat answer, then a burst that every DP rank must serve.

`/health` alone is not enough: after a headless rank dies it stays 200 while a share of requests
hang (DESIGN.md), so readiness ends with real requests, each with its own timeout.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

PROMPT = "Reply with the single word: ready"


def probe_body(served_name: str, max_tokens: int = 1) -> dict[str, Any]:
    """The smallest real request: one user turn, a token or a few back, no thinking."""
    return {
        "model": served_name,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"thinking": False},
    }


@dataclass(frozen=True)
class Probe:
    """How far a readiness probe got: 'down', 'health', 'models', 'chat' (ready), with why it stopped."""

    reached: str
    detail: str

    @property
    def ready(self) -> bool:
        return self.reached == "chat"


def _field(body: Any, key: str) -> list[Any]:
    """The list under `key` of a JSON answer; [] when the answer is not an object with one."""
    value = body.get(key) if isinstance(body, dict) else None
    return value if isinstance(value, list) else []


def probe(base_url: str, served_name: str, timeout: float) -> Probe:
    """One pass of health → models → chat; stops at the first step that does not pass."""
    try:
        with httpx.Client(base_url=base_url, timeout=timeout) as http:
            health = http.get("/health")
            if health.status_code != 200:
                return Probe("down", f"/health answered {health.status_code}")
            listed = http.get("/v1/models")
            models = _field(listed.json(), "data") if listed.status_code == 200 else []
            names = [m.get("id") for m in models if isinstance(m, dict)]
            if served_name not in names:
                return Probe("health", f"/v1/models lists {names or listed.status_code}, not {served_name!r}")
            answer = http.post("/v1/chat/completions", json=probe_body(served_name))
            if answer.status_code != 200:
                return Probe("models", f"chat answered {answer.status_code}: {answer.text[:200]}")
            choices = _field(answer.json(), "choices")
            if not choices or not isinstance(choices[0], dict) or choices[0].get("message") is None:
                return Probe("models", f"chat answered without a choice: {answer.text[:200]}")
            return Probe("chat", "chat answered")
    except httpx.TimeoutException:
        return Probe("down", f"no answer within {timeout:g}s")
    except (httpx.HTTPError, ValueError) as err:
        return Probe("down", f"{type(err).__name__}: {err}")


def burst(base_url: str, served_name: str, count: int, timeout: float) -> list[str]:
    """Send `count` chats at once; the failures (empty when all answered). A dead DP rank shows up here."""

    def one(i: int) -> str | None:
        try:
            response = httpx.post(f"{base_url}/v1/chat/completions", json=probe_body(served_name), timeout=timeout)
        except httpx.TimeoutException:
            return f"request {i}: no answer within {timeout:g}s"
        except httpx.HTTPError as err:
            return f"request {i}: {type(err).__name__}: {err}"
        return None if response.status_code == 200 else f"request {i}: HTTP {response.status_code}"

    with ThreadPoolExecutor(max_workers=count) as pool:
        return [failure for failure in pool.map(one, range(count)) if failure]
