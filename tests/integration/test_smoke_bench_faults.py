"""Smoke and bench against the test bed's vLLM stand-in told to fail: the verdicts fail, with counts and names.

The stand-in (testbed/standin/vllm_standin.py) serves node 0 and one headless rank as processes on this
machine (the process runtime). `vllm bench serve` is the REAL one, from the local profile's vLLM
environment, so the failed count is the real tool's (tests/standin_profile.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from k3deploy.blocks.loader import load_config
from k3deploy.core.errors import BenchStageFailed, SmokeStageFailed, ValidateFailed
from k3deploy.core.paths import runs_dir
from k3deploy.core.stage import FailureClass
from k3deploy.flows.bench import bench
from k3deploy.flows.launch import launch
from k3deploy.flows.smoke import smoke
from k3deploy.flows.teardown import teardown
from k3deploy.flows.validate import validate
from k3deploy.tasks import metrics
from k3deploy.tasks.render import bench_result_dir
from tests.bedconfig import write_config
from tests.ports import port_free
from tests.standin_profile import PORT, RPC_PORT, bench_runs_left, nothing_serving, standin_profile
from tests.vllm_env import needs_vllm_env

ROOT = Path(__file__).parents[2]
STANDIN = ROOT / "testbed" / "standin" / "vllm_standin.py"

SUCCESS = "vllm:request_success_total"
pytestmark = [pytest.mark.standin, pytest.mark.faults, pytest.mark.prefect, pytest.mark.usefixtures("runs_dir")]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The local profile with the stand-in as its server; (config path, the stand-in's control file)."""
    config = write_config(tmp_path / "standin.yaml", standin_profile(tmp_path))
    yield config, tmp_path / "control.json"
    teardown(config=config)
    assert not any((tmp_path / "serving").glob("*/pid")) and port_free(PORT) and port_free(RPC_PORT)


def with_expert_parallelism(config: str, tmp_path: Path) -> str:
    """The same deployment served with --enable-expert-parallel over its two DP ranks."""
    data = yaml.safe_load(Path(config).read_text())
    data["serve"] |= {"enable_expert_parallel": True, "expert_parallel_size": 2}
    return write_config(tmp_path / "ep.yaml", data)


def findings(failed: pytest.ExceptionInfo[Any]) -> dict[str, str]:
    return {f"{f.subject} {f.check}": f.detail for f in failed.value.result.findings if not f.ok}


def rank_pid(tmp_path: Path, rank: int) -> int:
    return int((tmp_path / "serving" / f"vllm-kimi-k3-local{rank}" / "pid").read_text())


def once_serving(config: str, tmp_path: Path, action: Callable[[], object]) -> threading.Thread:
    """`action` once this test's `vllm bench serve` runs and node 0 has answered one of its requests."""
    url = f"http://127.0.0.1:{yaml.safe_load(Path(config).read_text())['serve']['service_port']}"

    def served() -> float:
        try:
            return metrics.total(metrics.parse(httpx.get(f"{url}/metrics", timeout=5).text), SUCCESS) or 0.0
        except httpx.HTTPError:
            return 0.0

    def wait_then_act() -> None:
        deadline = time.monotonic() + 300
        while not bench_runs_left(tmp_path):
            assert time.monotonic() < deadline, "bench never started"
            time.sleep(0.1)  # polling for the condition, not timing the fault
        before = served()
        while served() <= before:
            assert time.monotonic() < deadline, "bench never got an answer"
            time.sleep(0.1)
        action()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def run_record(state: Any) -> dict[str, Any]:
    return json.loads((runs_dir() / str(state.state_details.flow_run_id) / "record.json").read_text())


@pytest.mark.bench
@pytest.mark.vllm
@needs_vllm_env
def test_bench_fails_with_the_failed_count_when_the_server_fails_a_share_of_requests(prefect_server, deployment):
    config, control = deployment
    launch(config=config)
    control.write_text(json.dumps({"K3SIM_FAIL_EVERY": "5"}))  # from now on every 5th request is a 500
    with pytest.raises(BenchStageFailed, match="1 check\\(s\\) failed") as failed:
        bench(config=config)
    found = findings(failed)
    assert list(found) == ["random c2 valid cell"]  # the cell is invalid, and it says why
    assert found["random c2 valid cell"].startswith("INVALID: 16/20 requests over 1 run(s)")
    # the failed requests in the tool's own words (--save-detailed's errors): the server's 500
    assert found["random c2 valid cell"].endswith("; run 1: 16 of 20 requests completed, 4 failed; "
                                                  "4 × 'Internal Server Error'")  # fmt: skip
    run = failed.value.result.data["runs"][0]
    assert (run["completed"], run["failed"], run["failed_reported"]) == (16, 4, True)  # vLLM 0.32 reports it
    assert Path(failed.value.result.data["folder"], "random-c2.json").exists()  # the tool's own JSON, kept
    assert not Path(bench_result_dir(load_config(config))).exists()  # and not left on the node (its working folder)


@pytest.mark.smoke
def test_a_rank_that_died_after_launch_fails_smoke_at_once_naming_it(prefect_server, deployment, tmp_path):
    config, _control = deployment
    launch(config=config)
    os.killpg(rank_pid(tmp_path, 1), signal.SIGKILL)  # the headless rank: node 0 says nothing, /health stays 200
    with pytest.raises(SmokeStageFailed) as failed:
        smoke(config=config)
    assert failed.value.result.data["service_lost"] == {
        "node": "local1",
        "rank": 1,
        "reason": failed.value.result.data["service_lost"]["reason"],
    }
    assert failed.value.result.reason.startswith(
        "local1: DP rank 1: the process is gone without an exit status (killed) during smoke"
    )
    assert list(findings(failed)) == ["local1 (DP rank 1) serving"]  # no check ran against a broken service


@pytest.mark.smoke
def test_a_prefix_cache_that_changes_the_answer_fails_smoke_as_the_engines_with_both_answers(
    prefect_server, deployment
):
    config, control = deployment
    launch(config=config)
    control.write_text(json.dumps({"K3SIM_CACHE_HIT_DIFFERS": "1"}))  # a hit is answered with its words reversed
    with pytest.raises(SmokeStageFailed) as failed:
        smoke(config=config)
    ((key, detail),) = findings(failed).items()  # the rest passed: only a cache hit is answered wrong
    assert key.endswith(" prefix cache"), key
    cold, cached = re.fullmatch(r"the answer served from the prefix cache differs from the cold one: "
                                r"cold '(.+)', cached '(.+)'", detail).groups()  # fmt: skip
    # both answers, as the server gave them (each cut to its first 120 characters: the last word may be cut)
    assert cached.split()[:-1] == [word[::-1] for word in cold.split()[:-1]] and len(cold.split()) > 5
    finding = next(f for f in failed.value.result.findings if f.check == "prefix cache")
    assert finding.cause is FailureClass.ENGINE


@pytest.mark.smoke
def test_a_fatal_line_while_serving_fails_smoke_naming_node_rank_and_line(prefect_server, deployment, tmp_path):
    """A collective timeout on rank 1 after ready (the process still runs, /health stays 200)."""
    config, control = deployment
    launch(config=config)
    line = (
        "[rank1]:[E324 13:00:25.428029551 compiler_depend.ts:574] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkHCCL(SeqNum=196, OpType=ALLREDUCE, Timeout(ms)=3600000) ran for 3600185 milliseconds before "
        "timing out."
    )  # a real line (tasks/watch/log_patterns.json, collective_timeout)
    control.write_text(json.dumps({"K3SIM_FATAL_LINE_DP1": line, "K3SIM_FATAL_KEEP_RUNNING": "1"}))
    with pytest.raises(SmokeStageFailed) as failed:
        smoke(config=config)
    lost = failed.value.result.data["service_lost"]
    assert (lost["node"], lost["rank"]) == ("local1", 1)
    assert lost["reason"].startswith("fatal log line collective_timeout (") and lost["reason"].endswith(f": {line}")
    cause = failed.value.result.failure  # whose problem: the collective's (a peer or the links), with the line
    assert cause is not None and (cause.failure_class, cause.node, cause.dp_rank) == ("infrastructure", "local1", 1)
    assert cause.evidence.endswith(line) and cause.family == "collective_timeout" and cause.log_line
    assert os.killpg(rank_pid(tmp_path, 1), 0) is None  # still running: the log line alone failed the stage


@pytest.mark.bench
@pytest.mark.vllm
@needs_vllm_env
def test_a_rank_killed_during_bench_stops_the_tool_and_fails_the_run_naming_it(prefect_server, deployment, tmp_path):
    config, control = deployment
    control.write_text(json.dumps({"K3SIM_TOKEN_S": "0.1"}))  # 20 requests of 16 tokens at c2: ~16 s of bench
    killer = once_serving(config, tmp_path, lambda: os.killpg(rank_pid(tmp_path, 1), signal.SIGKILL))
    state = validate(config=config, only=["launch", "bench"], return_state=True)
    killer.join()
    record = run_record(state)
    assert record["failed_stage"] == "bench"
    bench_stage = next(s for s in record["stages"] if s["stage"] == "bench")
    assert bench_stage["reason"].startswith("local1: DP rank 1: the process is gone without an exit status (killed)")
    assert bench_stage["data"]["service_lost"]["node"] == "local1"
    assert bench_runs_left(tmp_path) == []  # the tool was stopped, not left waiting on the dead rank
    assert not list((tmp_path / "runs").rglob("random-c2.json"))  # nothing measured passes as a result
    assert nothing_serving(tmp_path)  # validate's teardown ran

    control.write_text("{}")
    again = validate(config=config, only=["launch", "bench"], return_state=True)  # the rerun recovers
    assert run_record(again)["verdict"] == "pass"
    assert nothing_serving(tmp_path)


@pytest.mark.launch
def test_a_cann_error_in_a_rank_fails_the_run_as_an_engine_failure_named_by_its_family_in_the_record(
    prefect_server, deployment, tmp_path
):
    """A real published CANN line no specific pattern knows (vllm-ascend#5135), printed by rank 1 at start-up: named
    by the CANN code family, with where it is in the rank's log."""
    config, control = deployment
    line = "ERROR 12-17 09:31:58 [engine.py:458] EH9999: Inner Error!"
    control.write_text(json.dumps({"K3SIM_FATAL_LINE_DP1": line, "K3SIM_FATAL_KEEP_RUNNING": "1"}))
    state = validate(config=config, only=["launch", "smoke"], return_state=True)
    record = run_record(state)
    assert (record["verdict"], record["failed_stage"]) == ("fail", "launch")
    failure = record["failure"]
    assert (failure["failure_class"], failure["node"], failure["dp_rank"]) == ("engine", "local1", 1), failure
    assert "fatal log line cann_error_code EH9999 (" in failure["evidence"] and failure["evidence"].endswith(line)
    assert failure["family"] == "cann_error"
    log = runs_dir() / str(state.state_details.flow_run_id) / "logs" / "local1.log"
    assert log.read_bytes().decode().split("\n")[failure["log_line"] - 1] == line  # where the rank said it
    assert nothing_serving(tmp_path)


@pytest.mark.bench
@pytest.mark.vllm
@needs_vllm_env
def test_the_bench_tool_killed_mid_run_is_a_tool_failure_in_the_record_never_a_regression(
    prefect_server, deployment, tmp_path
):
    config, control = deployment
    control.write_text(json.dumps({"K3SIM_TOKEN_S": "0.1"}))  # ~16 s of bench: time to be killed in

    def kill_the_tool() -> None:
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                raw = cmdline.read_bytes()
                if str(tmp_path).encode() in raw and re.search(rb"bench[\0 ]serve", raw):
                    os.kill(int(cmdline.parent.name), signal.SIGKILL)

    killer = once_serving(config, tmp_path, kill_the_tool)
    state = validate(config=config, only=["launch", "bench"], return_state=True)
    killer.join()
    record = run_record(state)
    assert record["failed_stage"] == "bench"
    failure = record["failure"]
    assert failure["failure_class"] == "tool" and failure["node"] == "local0", failure
    assert failure["evidence"].startswith("vllm bench serve (random, concurrency 2) exited "), failure
    assert nothing_serving(tmp_path)

    from k3deploy.records.history import RegressionVerdict, compare
    from k3deploy.records.record import load_record

    loaded = load_record(runs_dir() / record["run_id"] / "record.json")
    assert compare(loaded, []).verdict is RegressionVerdict.INCONCLUSIVE  # the tool's failure says nothing of speed


@pytest.mark.bench
@pytest.mark.vllm
@needs_vllm_env
def test_prefix_caching_off_makes_the_prefix_cell_invalid_and_the_stage_fail(prefect_server, tmp_path):
    """A prefix-hit cell measured on a server without prefix caching says nothing of hits: INVALID, and the stage
    fails; the cold cell stays VALID (no cache at all: cold is cold). The stand-in serves, the real tool measures."""
    data = standin_profile(tmp_path)
    data["serve"]["enable_prefix_caching"] = False
    data["bench"]["prefix_hit"] = True
    config = write_config(tmp_path / "no-cache.yaml", data)
    try:
        state = validate(config=config, only=["launch", "bench"], return_state=True)
    finally:
        teardown(config=config)
    with pytest.raises(ValidateFailed, match="validate failed at bench"):
        state.result()
    record = run_record(state)
    stage = next(s for s in record["stages"] if s["stage"] == "bench")
    assert stage["verdict"] == "fail"
    cells = {c["workload"]: c for c in stage["data"]["cells"]}
    assert not cells["prefix_repetition"]["valid"]
    assert cells["prefix_repetition"]["reasons"][0].startswith("run 1: prefix caching is off")
    assert cells["random"]["valid"]
    finding = next(f for f in stage["findings"] if f["subject"] == "prefix_repetition c2")
    assert finding["check"] == "valid cell" and not finding["ok"] and "INVALID" in finding["detail"]
    assert nothing_serving(tmp_path)


@pytest.mark.bench
@pytest.mark.vllm
@needs_vllm_env
def test_a_rank_hanging_during_bench_is_named_once_stuck_and_the_tool_stopped(prefect_server, deployment, tmp_path):
    config, control = deployment
    quick = yaml.safe_load(Path(config).read_text())
    quick["serve"]["liveness"] = {"metrics_poll_s": 0.5, "stall_timeout_s": 3}
    config = write_config(tmp_path / "quick-watch.yaml", quick)
    launch(config=config)
    control.write_text(json.dumps({"K3SIM_TOKEN_S": "0.1"}))
    hang = {"K3SIM_TOKEN_S": "0.1", "K3SIM_HANG_DP1": "1"}  # rank 1 stops answering; its process and /health live
    hanger = once_serving(config, tmp_path, lambda: control.write_text(json.dumps(hang)))
    with pytest.raises(BenchStageFailed) as failed:
        bench(config=config)
    hanger.join()
    lost = failed.value.result.data["service_lost"]
    assert (lost["node"], lost["rank"]) == ("local1", 1)
    assert lost["reason"].startswith("stuck during bench: no token processed for ")
    assert "DP rank 1 (local1): " in lost["reason"] and "DP rank 0" not in lost["reason"]
    assert bench_runs_left(tmp_path) == []
    assert os.killpg(rank_pid(tmp_path, 1), 0) is None  # hung, not dead: the watch saw it from /metrics
    teardown(config=config)


@pytest.mark.launch
def test_with_expert_parallelism_node0_is_ready_only_after_the_slow_rank_joined(prefect_server, deployment, tmp_path):
    """EP: node 0 cannot finish start-up until every rank has loaded; launch waits for it, not for /health."""
    config, control = deployment
    ep_config = with_expert_parallelism(config, tmp_path)
    control.write_text(json.dumps({"K3SIM_STARTUP_S_DP1": 4}))  # the headless rank loads 8x slower than node 0
    result = launch(config=ep_config)
    seen = {(m["node"], m["milestone"]): m["seconds"] for m in result.data["milestones"]}
    assert seen[("local1", "kv_cache")] <= seen[("local0", "startup_complete")]
    assert seen[("local0", "kv_cache")] < seen[("local1", "kv_cache")]  # node 0 itself was done long before
    assert result.data["time_to_ready_s"] >= seen[("local1", "kv_cache")]
    teardown(config=ep_config)


@pytest.mark.smoke
def test_with_expert_parallelism_a_dead_rank_stalls_every_request_and_smoke_names_it(
    prefect_server, deployment, tmp_path
):
    """EP: every step is an all-to-all over all ranks, so one dead rank stalls all requests, not a share;
    smoke does not wait for them: the watch names the rank at once."""
    config, _control = deployment
    ep_config = with_expert_parallelism(config, tmp_path)
    launch(config=ep_config)
    os.killpg(rank_pid(tmp_path, 1), signal.SIGKILL)
    try:
        body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        with ThreadPoolExecutor(4) as pool:  # 4 requests: round robin would send two to the live rank 0
            answers = list(pool.map(lambda _: chat_or_timeout(body), range(4)))
        assert answers == ["no answer"] * 4
        with pytest.raises(SmokeStageFailed) as failed:
            smoke(config=ep_config)
        assert failed.value.result.data["service_lost"]["node"] == "local1"
    finally:
        teardown(config=ep_config)


def chat_or_timeout(body: dict[str, Any]) -> str:
    try:
        return str(httpx.post(f"http://127.0.0.1:{PORT}/v1/chat/completions", json=body, timeout=3).status_code)
    except httpx.TimeoutException:
        return "no answer"
