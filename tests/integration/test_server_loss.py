"""A run whose Prefect server goes away for good ends on its own: INCONCLUSIVE naming the server, torn down, its
record written, its table printed, within a stated bound, one line instead of Prefect's tracebacks; a server
restarted during a bench is a non-event: the run goes on and passes, its states on the server once it is back
(issue 48).

The local profile with the test bed's vLLM stand-in as its engine (tests/standin_profile.py: launch, teardown and
the runtime are the real ones; the ranks are told to take minutes to start, so launch is still waiting on them),
run by the CLI with k3deploy's own Prefect server (SQLite), as on a user's machine; that server is SIGKILLed once
launch has started both ranks, or once `vllm bench serve` runs and then started again on its port.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.teardown import remove_servers
from tests.bedconfig import write_config
from tests.cli_run import table_rows
from tests.postgres import BINARIES, needs_postgres, psql
from tests.standin_profile import bench_runs_left, nothing_serving, standin_profile
from tests.vllm_env import needs_vllm_env

pytestmark = [pytest.mark.standin, pytest.mark.launch, pytest.mark.prefect, pytest.mark.faults, pytest.mark.vllm,
              needs_vllm_env]  # fmt: skip
GRACE_S = 10
BOUND_S = GRACE_S + 90  # after the kill: the grace, a poll of the server, teardown and the record, on a loaded machine
START_S = 300  # the CLI's own server started, preflight, models and image done: launch starts


def test_a_run_whose_prefect_server_is_killed_during_launch_ends_inconclusive_torn_down_and_recorded(tmp_path):
    data = standin_profile(tmp_path)
    data["serve"]["env"] |= {"K3SIM_STARTUP_S": "240"}  # launch waits for ranks still starting when the server dies
    data["server"] = {"grace_seconds": GRACE_S}
    config = write_config(tmp_path / "local.yaml", data)
    home, runs = tmp_path / "home", tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}  # the CLI starts its own server
    env |= {"K3DEPLOY_HOME": str(home), "K3DEPLOY_RUNS_DIR": str(runs), "COLUMNS": "200"}
    command = [sys.executable, "-m", "k3deploy", "run", "-c", config, "--from", "launch"]  # preflight, then launch …
    run = subprocess.Popen(command, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    err: list[str] = []
    launching = threading.Event()

    def read_stderr() -> None:
        assert run.stderr is not None
        for line in run.stderr:
            err.append(line)
            if line.startswith("▶ launch"):
                launching.set()
        launching.set()  # the run ended before launch: said below

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert launching.wait(START_S) and run.poll() is None, "".join(err)
        deadline = time.monotonic() + START_S
        while len(list((tmp_path / "serving").glob("*/pid"))) < 2:  # both ranks started, neither ready
            assert time.monotonic() < deadline and run.poll() is None, "".join(err)
            time.sleep(0.1)
        server = json.loads((home / "prefect-server.json").read_text())
        os.killpg(server["pid"], signal.SIGKILL)  # the server and its children: its own session
        killed = time.monotonic()
        try:
            run.wait(timeout=BOUND_S)  # its stdout is the table and a few lines: the pipe never fills
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {BOUND_S} s after its server was killed:\n{''.join(err)}")
        ended_in = time.monotonic() - killed
        assert run.stdout is not None
        out = run.stdout.read()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        removed = remove_servers(load_config(config))  # whatever the run left (nothing, below)
    reader.join(10)
    said = "".join(err)
    url = server["url"]
    assert run.returncode == 1 and ended_in < BOUND_S, (run.returncode, said, out)
    # one line when the server went away and one when the run ends without it; none of Prefect's own
    assert said.count(f"the Prefect server at {url} does not answer") == 1, said
    assert f"the Prefect server at {url} has not answered for" in said, said
    for noise in ("Traceback", "failed to process item", "Error logging to API", "ConnectError"):
        assert noise not in said + out, said + out
    rows = {r[0]: r[1] for r in table_rows(out) if len(r) > 1}
    assert rows["launch"] == "inconclusive" and rows["teardown"] == "pass", out
    assert rows["preflight"] == "pass" and "models" not in rows, out  # --from launch
    assert rows["smoke"] == "skipped" and rows["bench"] == "skipped", out
    # the record in the runs folder: INCONCLUSIVE, the server named, what launch started removed by the run itself
    (record_path,) = runs.glob("*/record.json")
    record = json.loads(record_path.read_text())
    stages = {s["stage"]: s for s in record["stages"]}
    assert record["verdict"] == "inconclusive" and record["failed_stage"] is None
    assert url in stages["launch"]["reason"] and f"server.grace_seconds {GRACE_S}" in stages["launch"]["reason"]
    assert sum(len(names) for names in stages["teardown"]["data"]["removed"].values()) == 2  # both ranks
    assert (record_path.parent / "report.html").exists() and f"run record: {record_path}" in out
    # nothing left serving: the clean-up above found nothing, no pid file, the ports free
    assert not any(removed.values()), removed
    assert nothing_serving(tmp_path)


@needs_postgres
def test_a_prefect_server_restarted_during_bench_is_a_non_event_and_the_run_passes_with_its_states_on_it(
    postgres, tmp_path
):
    """The fleet's layout (PostgreSQL, authentication on): while `vllm bench serve` runs, PostgreSQL restarted, then
    the Prefect server killed and started again on its port, in turn."""
    data = standin_profile(tmp_path)
    data["serve"]["env"] |= {"K3SIM_TOKEN_S": "0.1"}  # 1.6 s a request: the bench outlasts the restarts
    config = write_config(tmp_path / "local.yaml", data)
    home, runs = tmp_path / "home", tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"K3DEPLOY_HOME": str(home), "K3DEPLOY_RUNS_DIR": str(runs), "COLUMNS": "200",
            "PREFECT_API_DATABASE_CONNECTION_URL": postgres}  # fmt: skip
    start = [sys.executable, "-m", "k3deploy", "server", "start", "--auth"]
    first = subprocess.run(start, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    token = (home / "prefect-server-auth").read_text().strip()
    auth = {"Authorization": f"Basic {base64.b64encode(token.encode()).decode()}"}  # as Prefect's client sends it
    command = [sys.executable, "-m", "k3deploy", "run", "-c", config, "--only", "launch", "--only", "bench"]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(run.stderr or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_S
        while not bench_runs_left(tmp_path):  # the bench tool runs: the server goes away under it
            assert time.monotonic() < deadline and run.poll() is None, "".join(err)
            time.sleep(0.1)
        restart_postgres(postgres)
        server = json.loads((home / "prefect-server.json").read_text())
        os.killpg(server["pid"], signal.SIGKILL)
        port = server["url"].rsplit(":", 1)[1].removesuffix("/api")
        again = subprocess.run([*start, "--port", port], env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and server["url"].removesuffix("/api") in again.stdout + again.stderr, again
        try:
            run.wait(timeout=600)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 600 s after its server came back:\n{''.join(err)}")
        assert run.stdout is not None
        out = run.stdout.read()
        reader.join(10)
        said = "".join(err)
        assert run.returncode == 0, said + out
        assert f"the Prefect server at {server['url']} does not answer" in said
        assert f"the Prefect server at {server['url']} answers again after" in said
        rows = {r[0]: r[1] for r in table_rows(out) if len(r) > 1}
        assert rows == {"preflight": "pass", "launch": "pass", "bench": "pass", "teardown": "pass"}, out
        # the run's states on the server once it is back: the run, its bench and its teardown Completed
        (record_path,) = runs.glob("*/record.json")
        run_id, api = record_path.parent.name, server["url"]
        flow_run = httpx.get(f"{api}/flow_runs/{run_id}", headers=auth, timeout=30).json()
        assert (flow_run.get("state") or {}).get("type") == "COMPLETED", flow_run
        query = {"flow_runs": {"parent_flow_run_id": {"any_": [run_id]}}}
        children = httpx.post(f"{api}/flow_runs/filter", json=query, headers=auth, timeout=30).json()
        names = {httpx.get(f"{api}/flows/{c['flow_id']}", headers=auth, timeout=30).json()["name"]: c["state"]["type"]
                 for c in children}  # fmt: skip
        assert names.get("bench") == "COMPLETED" and names.get("teardown") == "COMPLETED", names
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        remove_servers(load_config(config))
        subprocess.run([sys.executable, "-m", "k3deploy", "server", "stop"], env=env, capture_output=True, timeout=60)
    assert nothing_serving(tmp_path) and not bench_runs_left(tmp_path)


def restart_postgres(url: str) -> None:
    """PostgreSQL stopped (fast: every connection cut) and started again with the options it ran with."""
    data = psql(url, "SHOW data_directory")
    log = str(Path(data).parent / "log")  # its own output there: a pipe held by the postmaster would never close
    subprocess.run(["runuser", "-u", "postgres", "--", str(BINARIES[-1]), "-D", data, "-l", log, "-m", "fast", "-w",
                    "-t", "60", "restart"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120, cwd="/")  # fmt: skip
