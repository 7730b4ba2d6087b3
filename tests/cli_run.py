"""`k3deploy run` in a subprocess as a person runs it, and what its terminal shows (for the CLI and e2e tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

STAGES = ["preflight", "models", "comm", "image", "launch", "smoke", "conformance", "bench", "capacity", "soak",
          "accuracy", "teardown"]  # fmt: skip


def k3deploy_run(config: str | Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "COLUMNS": "200"}
    env |= {"K3DEPLOY_RUNS_DIR": str(tmp_path / "runs"), "K3DEPLOY_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "k3deploy", "run", "-c", str(config), *args]
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
