"""A proxy in front of the real vLLM that breaks the served API's contract on purpose, one rule per fault, so the
conformance stage is shown catching each. Everything else passes through unchanged (streams line by line).

Faults (`faults`, kind → setting, changed between runs):
- "invalid": NAME — a call to NAME gets arguments its schema refuses (an undeclared key);
- "empty-delta": N — a stream opened while more than N are open, or of a load pass once more than N of its streams
  have been open at once, gets an empty `tool_calls` delta before each call delta. The stage's X-Request-Id says
  which sending and pass a request is of; a load-pass stream waits (bounded) at its start until that crowd forms:
  the load pass sends its streams first, so it forms however fast the server answers or the client sends;
- "differs" — a streamed answer's first content delta gains a "!" (the whole answer keeps its text);
- "prompt-tokens" — `usage.prompt_tokens` one more than the server said;
- "500" — a request with a negative temperature gets HTTP 500 instead of the server's 400;
- "leak" — the reasoning is put in front of the content (whole and streamed alike).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


class Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.upstream = upstream.rstrip("/")
        self.faults: dict[str, Any] = {}
        self.open_streams = 0
        self.crowded: set[str] = set()  # the sendings (X-Request-Id's suite part) whose crowd has formed
        self.most_open = 0  # the most streams open at once (the load pass must have opened more than N)
        self.request_ids: list[str] = []  # every POST's X-Request-Id, as it came
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def has(self, kind: str) -> bool:
        return kind in self.faults


class Handler(BaseHTTPRequestHandler):
    server: Proxy
    protocol_version = "HTTP/1.0"  # each answer ends with its connection: a stream needs no length

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # /metrics, /health, /v1/models: as they are
        upstream = httpx.get(self.server.upstream + self.path, timeout=60)
        self._send(upstream.status_code, upstream.content, upstream.headers.get("content-type", "text/plain"))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        proxy = self.server
        with proxy.lock:
            proxy.request_ids.append(self.headers.get("X-Request-Id", ""))
        if proxy.has("500") and isinstance(body.get("temperature"), int | float) and body["temperature"] < 0:
            self._send(500, b'{"error": {"message": "Internal Server Error", "code": 500}}', "application/json")
            return
        if body.get("stream"):
            self._stream(body)
            return
        upstream = httpx.post(proxy.upstream + self.path, json=body, headers=self._passed(), timeout=300)
        data = upstream.json() if upstream.status_code == 200 else None
        if isinstance(data, dict):
            self._whole(data)
            content = json.dumps(data).encode()
        else:
            content = upstream.content
        self._send(upstream.status_code, content, "application/json")

    def _passed(self) -> dict[str, str]:
        """The request's X-Request-Id, passed on: the engine's log names the request as the stage does."""
        return {"X-Request-Id": self.headers["X-Request-Id"]} if "X-Request-Id" in self.headers else {}

    def _send(self, status: int, content: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def _usage(self, usage: Any) -> None:
        if isinstance(usage, dict) and self.server.has("prompt-tokens"):
            usage["prompt_tokens"] += 1

    def _args(self, call: dict[str, Any]) -> None:
        function = call.get("function") or {}
        if function.get("name") and function.get("name") == self.server.faults.get("invalid"):
            function["arguments"] = json.dumps({"undeclared": 1})

    def _whole(self, data: dict[str, Any]) -> None:
        self._usage(data.get("usage"))
        for choice in data.get("choices") or []:
            message = choice.get("message") or {}
            for call in message.get("tool_calls") or []:
                self._args(call)
            reasoning = message.get("reasoning") or message.get("reasoning_content")
            if reasoning and self.server.has("leak"):
                message["content"] = f"{reasoning} {message.get('content') or ''}"

    def _stream(self, body: dict[str, Any]) -> None:
        proxy = self.server
        with proxy.changed:
            proxy.open_streams += 1
            proxy.most_open = max(proxy.most_open, proxy.open_streams)
            proxy.changed.notify_all()
        try:
            crowded = self._crowd()
            sent = httpx.stream("POST", proxy.upstream + self.path, json=body, headers=self._passed(), timeout=300)
            with sent as upstream:
                self.send_response(upstream.status_code)
                self.send_header("content-type", upstream.headers.get("content-type", "text/event-stream"))
                self.end_headers()
                for line in self._lines(upstream.iter_lines(), crowded):
                    self.wfile.write((line + "\n").encode())
                    self.wfile.flush()
        finally:
            with proxy.changed:
                proxy.open_streams -= 1
                proxy.changed.notify_all()

    def _lines(self, lines: Iterator[str], crowded: bool) -> Iterator[str]:
        """The stream's lines with the faults applied; the reasoning seen so far goes in front of the content."""
        reasoning, content_seen = "", False
        for line in lines:
            if not line.startswith("data: {"):
                yield line
                continue
            event = json.loads(line[6:])
            self._usage(event.get("usage"))
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
                if delta.get("content") and not content_seen:
                    content_seen = True
                    if self.server.has("differs"):
                        delta["content"] += "!"
                    if reasoning and self.server.has("leak"):
                        delta["content"] = f"{reasoning} {delta['content']}"
                for call in delta.get("tool_calls") or []:
                    self._args(call)
                if delta.get("tool_calls") and crowded:
                    empty = {**event, "choices": [{"index": choice.get("index", 0), "delta": {"tool_calls": []}}]}
                    yield "data: " + json.dumps(empty)
                    yield ""
            yield "data: " + json.dumps(event)

    def _crowd(self) -> bool:
        """Whether this stream gets the empty-delta fault: more than N streams open now, or it is of a load pass
        whose crowd has formed. A load-pass stream waits (bounded) at its start until its sending's crowd forms:
        the streams that form it stay open meanwhile, so none of them misses it."""
        proxy, limit = self.server, self.server.faults.get("empty-delta")
        if limit is None:
            return False
        parts = self.headers.get("X-Request-Id", "").split("-")  # k3deploy-conformance-<suite>-<load>-<index>
        suite, load = (parts[2], parts[3]) if len(parts) == 5 else ("", "")
        with proxy.changed:
            if load == "load" and suite not in proxy.crowded:
                proxy.changed.wait_for(lambda: proxy.open_streams > limit or suite in proxy.crowded, timeout=30)
                if proxy.open_streams > limit:
                    proxy.crowded.add(suite)
                    proxy.changed.notify_all()
            return proxy.open_streams > limit or (load == "load" and suite in proxy.crowded)


def start(upstream: str) -> Proxy:
    proxy = Proxy(upstream)
    threading.Thread(target=proxy.serve_forever, daemon=True, name="conformance-proxy").start()
    return proxy
