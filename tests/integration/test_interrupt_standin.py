"""Ctrl-C during a run leaves nothing serving: the terminal's SIGINT reaches the CLI and everything it started in
the foreground (the real `vllm bench serve` among them); the run's crash hook removes the ranks it started and
the CLI says it was interrupted and exits 130.

The local profile with the test bed's vLLM stand-in as its engine (tests/standin_profile.py), 40 ms a token so that
the bench is still running; the CLI with k3deploy's own Prefect server, as on a user's machine. The SIGINT goes to
the CLI's process group, as a terminal sends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.teardown import remove_servers
from tests.bedconfig import write_config
from tests.standin_profile import bench_runs_left, nothing_serving, standin_profile
from tests.vllm_env import needs_vllm_env

pytestmark = [pytest.mark.standin, pytest.mark.launch, pytest.mark.faults, pytest.mark.vllm, needs_vllm_env]
START_S = 300  # the CLI's own server started, preflight and launch done: the bench runs
BOUND_S = 120  # after the SIGINT: the crash hook's teardown and the exit, on a loaded machine


def test_ctrl_c_during_bench_stops_the_run_and_leaves_nothing_serving(tmp_path):
    data = standin_profile(tmp_path)
    data["serve"]["env"] |= {"K3SIM_TOKEN_S": "0.04"}  # the bench lasts minutes
    config = write_config(tmp_path / "local.yaml", data)
    home, runs = tmp_path / "home", tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # the CLI starts its own server
    env |= {"K3DEPLOY_HOME": str(home), "K3DEPLOY_RUNS_DIR": str(runs), "COLUMNS": "200"}
    command = [sys.executable, "-m", "k3deploy", "run", "-c", config, "--only", "launch", "--only", "bench"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           start_new_session=True)  # fmt: skip  # its own process group, as a terminal's job
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(run.stderr or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_S
        while not bench_runs_left(tmp_path):
            assert time.monotonic() < deadline and run.poll() is None, "".join(err)
            time.sleep(0.2)  # polling for a state (the bench tool's process), bounded above
        assert len(list((tmp_path / "serving").glob("*/pid"))) == 2  # both ranks serving
        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C
        try:
            run.wait(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {BOUND_S} s after Ctrl-C:\n{''.join(err)}")
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        left = remove_servers(load_config(config))  # whatever the run left (nothing, below)
        subprocess.run([sys.executable, "-m", "k3deploy", "server", "stop"], env=env, capture_output=True,
                       timeout=120, check=False)  # fmt: skip
    reader.join(10)
    said = "".join(err)
    assert run.returncode == 130 and said.endswith("k3deploy: interrupted\n"), (run.returncode, said)
    assert not any(left.values()), (left, said)  # the run removed its ranks itself
    assert nothing_serving(tmp_path) and not bench_runs_left(tmp_path)
