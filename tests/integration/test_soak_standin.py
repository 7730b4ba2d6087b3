"""Soaks that fail for time-borne faults, made for real on the test bed's vLLM stand-in (fast to start, told to
misbehave as time goes on): a rank killed in window 3, a server that slows down, a rank that leaks memory; and the
Retry of a soak cut short, which runs only what is left. Every window is a REAL `vllm bench serve` run, and each
rank's memory is read from its real process group (tests/standin_profile.py).

The faults start on states, never on time: window N's memory reading written (the window judged), or window N's
`vllm bench serve` running.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from k3deploy.cli.rerun import retry
from k3deploy.core.errors import SoakStageFailed
from k3deploy.core.paths import runs_dir
from k3deploy.flows.launch import launch
from k3deploy.flows.registry import StageOptions
from k3deploy.flows.soak import soak
from k3deploy.flows.teardown import teardown
from k3deploy.flows.validate import validate
from k3deploy.records.record import read_record
from k3deploy.tasks.render import bench_file
from tests.bedconfig import write_config
from tests.ports import port_free
from tests.standin_profile import PORT, RPC_PORT, bench_runs_left, standin_profile
from tests.vllm_env import needs_vllm_env

pytestmark = [pytest.mark.standin, pytest.mark.faults, pytest.mark.prefect, pytest.mark.bench, pytest.mark.vllm,
              needs_vllm_env, pytest.mark.usefixtures("runs_dir")]  # fmt: skip
WAIT_S = 300  # every wait below is for a state, bounded


@pytest.fixture
def soaking(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """The stand-in profile with a soak section of the test's own (short windows, two in flight)."""

    def config(soak_section: dict[str, Any], env: dict[str, str] | None = None) -> str:
        data = standin_profile(tmp_path)
        data["soak"] = {"window_prompts": 8, "concurrency": 2} | soak_section
        data["serve"]["env"] |= env or {}
        return write_config(tmp_path / "soak.yaml", data)

    yield config
    if (tmp_path / "soak.yaml").exists():
        teardown(config=str(tmp_path / "soak.yaml"))
    assert not any((tmp_path / "serving").glob("*/pid")) and port_free(PORT) and port_free(RPC_PORT)


def judged(window: int) -> list[Path]:
    """Window N's memory reading, written once the window is judged (in any run's soak folder)."""
    name = Path(bench_file("random", 2, window)).with_suffix(".memory.json").name  # as the soak names it
    return list(runs_dir().glob(f"*/soak/*/{name}"))


def when(what: str, ready: Callable[[], object], action: Callable[[], object]) -> threading.Thread:
    """`action` once `ready()` holds (polled: a state of files and processes, nothing to wait on but them)."""

    def run() -> None:
        deadline = time.monotonic() + WAIT_S
        while not ready():
            assert time.monotonic() < deadline, f"never: {what}"
            time.sleep(0.1)
        action()

    thread = threading.Thread(target=run, daemon=True, name=what)
    thread.start()
    return thread


def rank_group(tmp_path: Path, rank: int) -> int:
    return int((tmp_path / "serving" / f"vllm-kimi-k3-local{rank}" / "pid").read_text())


def soak_findings(err: pytest.ExceptionInfo[SoakStageFailed]) -> dict[str, str]:
    return {f"{f.subject}: {f.check}": f.detail for f in err.value.result.findings if not f.ok}


def test_a_rank_killed_in_window_3_fails_the_soak_naming_it_and_the_retry_runs_only_what_is_left(
    prefect_server, soaking, tmp_path
):
    config = soaking({"minutes": 0.01, "drift": {"windows": 1, "latency": 3.0, "throughput": 0.9}})  # 3 windows
    third = threading.Event()

    def kill_rank_1() -> None:
        os.killpg(rank_group(tmp_path, 1), signal.SIGKILL)
        third.set()

    when("window 3's bench running", lambda: judged(2) and bench_runs_left(tmp_path), kill_rank_1)
    state = validate(config=config, only=("launch", "soak"), stages=StageOptions(soak=True), return_state=True)
    run_id = str(state.state_details.flow_run_id)
    assert third.is_set() and state.is_failed()
    record = read_record(run_id)
    stage = record.stage("soak")
    assert record.failed_stage == "soak" and stage is not None
    assert [w["index"] for w in stage.data["windows"]] == [1, 2] and stage.data["lost_in_window"] == 3
    bad = {f"{f.subject}: {f.check}": f.detail for f in stage.findings if not f.ok}
    assert "the service was lost in window 3 after 2 window(s) judged" in bad["window 3: soak window"]
    assert "local1 (DP rank 1): serving" in bad
    assert record.soak is not None and record.soak.windows == 2 and record.failure is not None
    assert record.failure.node == "local1" and record.failure.dp_rank == 1

    again = retry(run_id)  # the UI's Retry: the same flow run again
    assert again.is_completed(), again
    retried = read_record(run_id)
    windows = retried.stage("soak").data["windows"]  # type: ignore[union-attr]
    assert [w["resumed"] for w in windows[:2]] == [True, True] and not any(w["resumed"] for w in windows[2:])
    assert windows[2]["index"] == 3 and len(windows) >= 3  # window 3 measured again, from the start
    assert retried.soak is not None and retried.soak.resumed_windows == 2 and len(windows) == 3
    assert all(w["valid"] for w in windows)


def test_a_server_that_slows_down_is_caught_as_latency_drift_with_the_figures(prefect_server, soaking, tmp_path):
    """10 ms a token for the first window, 60 ms from the second on (the stand-in's control file)."""
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"K3SIM_TOKEN_S": 0.01}))
    config = soaking({"minutes": 0.01, "drift": {"windows": 1, "latency": 1.0, "throughput": 0.5}})  # 3 windows
    assert launch(config=config).verdict == "pass"
    when("window 1 judged", lambda: judged(1), lambda: control.write_text(json.dumps({"K3SIM_TOKEN_S": 0.06})))
    with pytest.raises(SoakStageFailed) as failed:
        soak(config=config, soak=True)
    bad = soak_findings(failed)
    e2el = bad["median E2EL: latency drift"]
    assert "beyond soak.drift.latency 100%" in e2el and "against 1–1's" in e2el, e2el
    assert "output throughput: throughput drift" in bad  # six times slower: throughput fell as far
    windows = failed.value.result.data["windows"]
    assert len(windows) >= 2 and all(w["valid"] for w in windows)  # every request served: drift, not failure
    first, last = windows[0]["figures"]["median_e2el_ms"], windows[-1]["figures"]["median_e2el_ms"]
    assert f"{last:.4g} ms in windows" in e2el and f"{first:.4g} ms" in e2el and last > 3 * first


def test_a_rank_leaking_memory_is_named_with_its_slope_and_the_steady_one_passes(prefect_server, soaking, tmp_path):
    """Rank 1 keeps 8 MiB of every request it answers (K3SIM_LEAK_MB_PER_REQUEST_DP1): about half of each window's."""
    drift = {"windows": 1, "latency": 3.0, "throughput": 0.9, "memory_noise_mb": 32}
    leak = {"K3SIM_LEAK_MB_PER_REQUEST_DP1": "8"}
    config = soaking({"minutes": 0.01, "window_prompts": 16, "drift": drift}, env=leak)
    assert launch(config=config).verdict == "pass"
    with pytest.raises(SoakStageFailed) as failed:
        soak(config=config, soak=True)
    rows = {f"{f.subject}: {f.check}": f for f in failed.value.result.findings}
    leak = rows["local1 (DP rank 1): memory growth"]
    assert not leak.ok and "MiB/h over windows 2–" in leak.detail
    assert "within soak.drift.memory_horizon_hours 24" in leak.detail
    steady = rows["local0 (DP rank 0): memory growth"]
    assert steady.ok and "steady" in steady.detail
    windows = failed.value.result.data["windows"]
    grown = [w["memory"]["local1 (DP rank 1)"]["bytes"] for w in windows]
    assert len(windows) == 3 and grown == sorted(grown) and grown[-1] - grown[0] > 32 * 2**20
