"""The CLI as a person runs it, against the test bed: progress and the stage table, the runs store, the
Prefect server it starts once and reuses."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from k3deploy.records.record import SCHEMA_PATH
from tests.bedconfig import bed_config, write_config
from tests.launchbed import launch_data

pytestmark = [pytest.mark.cli, pytest.mark.testbed, pytest.mark.prefect]
ROOT = Path(__file__).parents[2]


def k3deploy(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3deploy", *map(str, args)], capture_output=True, text=True, env=env, timeout=600
    )


def test_run_shows_each_stage_records_the_run_and_report_reads_it(prefect_server, testbed, tmp_path):
    from prefect.settings import PREFECT_API_URL

    config = write_config(tmp_path / "bed.yaml", launch_data(testbed))
    runs = tmp_path / "runs"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "COLUMNS": "200"}
    out = k3deploy("run", "-c", config, "--only", "image", "--runs-dir", runs, env=env)
    assert out.returncode == 0, out.stderr
    for stage in ("preflight", "image", "teardown"):  # live progress, one start and one end line per stage
        assert f"▶ {stage} …" in out.stderr and f"■ {stage} pass in " in out.stderr
    assert "models" not in out.stderr
    table = [line for line in out.stdout.splitlines() if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in table] == ["preflight", "image", "teardown"]
    assert "Traceback" not in out.stderr + out.stdout

    listed = k3deploy("runs", "--runs-dir", runs, env=env)
    (run_id,) = [p.name for p in runs.iterdir()]
    assert listed.returncode == 0 and run_id in listed.stdout and "pass" in listed.stdout

    shown = k3deploy("report", run_id[:8], "--runs-dir", runs, env=env)
    assert shown.returncode == 0 and f"run {run_id}" in shown.stdout and "host key node0: SHA256:" in shown.stdout
    document = json.loads(k3deploy("report", run_id, "--format", "json", "--runs-dir", runs, env=env).stdout)
    jsonschema.validate(document, json.loads(SCHEMA_PATH.read_text()))
    assert [s["stage"] for s in document["stages"]] == ["preflight", "image", "teardown"]


def test_without_prefect_api_url_the_cli_starts_one_server_and_reuses_it(testbed, tmp_path):
    config = write_config(tmp_path / f"bed-{random.randrange(10**9)}.yaml", bed_config(testbed))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"K3DEPLOY_HOME": str(tmp_path / "home"), "K3DEPLOY_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "200"}
    try:
        first = k3deploy("rerun", "-c", config, "preflight", env=env)
        assert first.returncode == 0, first.stderr
        assert "starting a local Prefect server at http://127.0.0.1:" in first.stderr
        second = k3deploy("rerun", "-c", config, "preflight", env=env)
        assert second.returncode == 0, second.stderr
        assert "starting a local Prefect server" not in second.stderr  # reused
        assert "Failed to send telemetry" not in first.stderr + second.stderr
        status = k3deploy("server", "status", env=env)
        assert status.stdout.startswith("running at http://127.0.0.1:")
    finally:
        stopped = k3deploy("server", "stop", env=env)
    assert stopped.stdout.startswith("stopped the server at http://127.0.0.1:")
    assert k3deploy("server", "status", env=env).stdout.startswith("not running")


def test_a_failed_run_and_a_failed_rerun_exit_1(prefect_server, testbed, tmp_path):
    from prefect.settings import PREFECT_API_URL

    config = write_config(tmp_path / "bed.yaml", launch_data(testbed))  # nothing serves: smoke cannot pass
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "COLUMNS": "200"}
    out = k3deploy("run", "-c", config, "--only", "smoke", "--runs-dir", tmp_path / "runs", env=env)
    assert out.returncode == 1 and "■ smoke fail in " in out.stderr, out.stderr
    again = k3deploy("rerun", "-c", config, "smoke", env=env)
    assert again.returncode == 1 and "smoke" in again.stdout + again.stderr
