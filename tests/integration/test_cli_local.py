"""`k3deploy run -c configs/local.yaml` as a person runs it (the README's main job): the terminal shows the
stage lines and the table, and Prefect's log stream goes to the run's log file, not the terminal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from k3deploy.blocks.loader import load_config

pytestmark = [pytest.mark.cli, pytest.mark.e2e, pytest.mark.vllm, pytest.mark.prefect]
PROFILE = Path(__file__).parents[2] / "configs" / "local.yaml"
STAGES = ["preflight", "models", "comm", "image", "launch", "smoke", "bench", "accuracy", "teardown"]


def k3deploy_run(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "COLUMNS": "200"}
    env |= {"K3DEPLOY_RUNS_DIR": str(tmp_path / "runs"), "K3DEPLOY_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "k3deploy", "run", "-c", str(PROFILE)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=1200)


def assert_quiet(out: subprocess.CompletedProcess[str]) -> None:
    """Nothing of Prefect's stream on the terminal: no traceback, no log level column."""
    both = out.stdout + out.stderr
    assert "Traceback" not in both and "| ERROR" not in both and "| INFO" not in both, both


def table_rows(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in stdout.splitlines() if line.startswith("│")]


def log_file(stdout: str) -> Path:
    (line,) = [line for line in stdout.splitlines() if line.startswith("log: ")]
    return Path(line.removeprefix("log: "))


def test_a_passing_local_run_prints_the_stage_lines_and_the_table_and_logs_prefect_to_its_file(
    prefect_server, tmp_path
):
    out = k3deploy_run(tmp_path)
    assert out.returncode == 0, out.stderr
    assert_quiet(out)
    progress = out.stderr.splitlines()
    assert len(progress) == 2 * len(STAGES), out.stderr  # one start and one end line per stage, nothing else
    assert [line.split()[1] for line in progress[1::2]] == STAGES
    assert [row[:2] for row in table_rows(out.stdout)] == [
        [stage, "not-applicable" if stage == "accuracy" else "pass"] for stage in STAGES
    ]
    assert len(out.stdout.splitlines()) <= 32, out.stdout  # the table and where the record, log and report are
    log = log_file(out.stdout)
    assert log.parent.parent == tmp_path / "runs" and log.name == "prefect.log"
    text = log.read_text()
    assert "Beginning flow run" in text and "Finished in state Completed()" in text
    assert "Error encountered when computing cache key" not in text  # every task's inputs can be hashed


def test_a_run_refused_at_preflight_prints_its_reason_and_the_table_and_no_traceback(prefect_server, tmp_path):
    port = load_config(str(PROFILE)).serve.service_port
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        out = k3deploy_run(tmp_path)
    assert out.returncode == 1, out.stderr
    assert_quiet(out)
    progress = out.stderr.splitlines()
    assert progress[:2] == ["▶ preflight …", "■ preflight fail in " + progress[1].split(" in ", 1)[1]]
    assert f"local0: ports: service_port {port} is taken" in progress[2]
    assert progress[3:] == ["▶ teardown …", "■ teardown pass in " + progress[4].split(" in ", 1)[1]]
    rows = table_rows(out.stdout)
    assert [row[:2] for row in rows] == [["preflight", "fail"]] + [[s, "skipped"] for s in STAGES[1:-1]] + [
        ["teardown", "pass"]
    ]
    assert len(out.stdout.splitlines()) <= 32, out.stdout
    words = " ".join(out.stdout.split())  # the table's terminal may wrap the line
    assert f"failed at preflight: infrastructure: local0: ports: service_port {port} is taken" in words, out.stdout
    text = log_file(out.stdout).read_text()
    assert "Finished in state Failed" in text  # Prefect's own account of the failure is in the file
