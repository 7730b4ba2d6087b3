"""The tiny Kimi-K3-shaped checkpoint served by the REAL vLLM (CPU build) with the kimi_k3 tokenizer mode and parsers.

One server per variant, on a free loopback port, from the environment K3DEPLOY_VLLM_ENV names (see the local profile's
environment recipe); each server's whole process group is stopped at the end and checked gone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3deploy.localprofile import checkpoint as ck
from k3deploy.tasks.smoke.checks import QUESTION, TOOL_SCHEMA
from tests.vllm_env import VLLM, VLLM_ENV, needs_vllm_env

READY_WITHIN_S = 420.0
SERVED = "tiny-k3"

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.models,
    needs_vllm_env,
]

TOOLS = [TOOL_SCHEMA]
USER = [{"role": "user", "content": QUESTION}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group_alive(pgid: int) -> list[int]:
    """Processes of the group that still run (zombies waiting for a reaper do not count)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except (urllib.error.URLError, OSError):
        return 0


def post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        base + path, json.dumps({"model": SERVED, **body}).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        assert r.status == 200
        return dict(json.load(r))


def _serve(folder: Path, log: Path) -> Iterator[str]:
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "PATH": f"{VLLM_ENV / 'bin'}:{os.environ.get('PATH', '')}",
    }
    command = [
        str(VLLM), "serve", str(folder), "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--max-model-len", "2048", "--max-num-seqs", "4",
        "--tokenizer-mode", "kimi_k3", "--reasoning-parser", "kimi_k3",
        "--tool-call-parser", "kimi_k3", "--enable-auto-tool-choice",
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        started, deadline = time.monotonic(), time.monotonic() + READY_WITHIN_S
        while _get(base + "/health") != 200:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited rc {proc.returncode} before ready:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not ready within {READY_WITHIN_S:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(1.0)
        print(f"vllm serve {folder.name} ready in {time.monotonic() - started:.1f} s")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (left := _group_alive(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            os.killpg(proc.pid, signal.SIGKILL)
        assert not left, f"vllm processes left behind: {left}"


@pytest.fixture(scope="class")
def scripted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("scripted-k3")
    ck.write_checkpoint(folder, scripted=True)
    yield from _serve(folder, folder.parent / "scripted-vllm.log")


@pytest.fixture(scope="class")
def random_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("random-k3")
    ck.write_checkpoint(folder, scripted=False)
    yield from _serve(folder, folder.parent / "random-vllm.log")


class TestScripted:
    def test_auto_tool_choice_parses_reasoning_content_and_call(self, scripted_server: str) -> None:
        body = {"messages": USER, "tools": TOOLS, "tool_choice": "auto", "temperature": 0, "max_tokens": 64}
        choice = post(scripted_server, "/v1/chat/completions", body)["choices"][0]
        message = choice["message"]
        assert choice["finish_reason"] == "tool_calls"
        [call] = message["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        assert (message.get("reasoning") or message.get("reasoning_content")) == ck.REASONING
        assert message["content"] == ck.TOOL_CONTENT

    def test_streaming_delivers_the_same_parts(self, scripted_server: str) -> None:
        body = {"model": SERVED, "messages": USER, "tools": TOOLS, "temperature": 0, "max_tokens": 64, "stream": True}
        request = urllib.request.Request(
            scripted_server + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        reasoning, content, calls, finish = "", "", [], None
        with urllib.request.urlopen(request, timeout=120) as r:
            for line in r:
                if not line.startswith(b"data: {"):
                    continue
                choice = json.loads(line[6:])["choices"][0]
                delta = choice["delta"]
                reasoning += delta.get("reasoning") or ""
                content += delta.get("content") or ""
                calls += delta.get("tool_calls") or []
                finish = choice.get("finish_reason") or finish
        assert (reasoning, content, finish) == (ck.REASONING, ck.TOOL_CONTENT, "tool_calls")
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            ("get_weather", {"city": "Paris"})
        ]

    def test_thinking_off_without_tools_returns_content(self, scripted_server: str) -> None:
        body = {"messages": USER, "temperature": 0, "max_tokens": 64, "chat_template_kwargs": {"thinking": False}}
        choice = post(scripted_server, "/v1/chat/completions", body)["choices"][0]
        assert choice["message"]["content"] == ck.PLAIN_CONTENT
        assert not choice["message"].get("tool_calls")
        assert not (choice["message"].get("reasoning") or choice["message"].get("reasoning_content"))
        assert choice["finish_reason"] == "stop"


class TestRandom:
    def test_random_weights_are_served_but_no_tool_call_parses(self, random_server: str) -> None:
        body = {"messages": USER, "tools": TOOLS, "tool_choice": "auto", "temperature": 0, "max_tokens": 32}
        choice = post(random_server, "/v1/chat/completions", body)["choices"][0]
        assert not choice["message"].get("tool_calls")
        assert choice["finish_reason"] != "tool_calls"
        models = json.loads(urllib.request.urlopen(random_server + "/v1/models", timeout=10).read())
        assert [m["id"] for m in models["data"]] == [SERVED]
