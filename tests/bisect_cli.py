"""`k3deploy bisect` as a person runs it, for the bisect tests on the real vLLM and on the stand-in: the CLI in
a subprocess against the tests' Prefect server and one runs store, and the stage flows a bisect started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

from k3deploy.records.bisect_record import BISECT_SCHEMA_PATH

ROOT = Path(__file__).parents[1]


class K3deploy:
    """The CLI in a subprocess, against the tests' Prefect server and one runs store."""

    def __init__(self, folder: Path) -> None:
        from prefect.settings import PREFECT_API_URL

        self.runs = folder / "runs"
        self.env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "COLUMNS": "200",
                    "K3DEPLOY_RUNS_DIR": str(self.runs), "K3DEPLOY_HOME": str(folder / "home")}  # fmt: skip

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "k3deploy", *args]
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=1400, cwd=ROOT)

    def run(self, config: Path, *args: str) -> str:
        out = self("run", "-c", str(config), *args)
        (line,) = [line for line in out.stdout.splitlines() if line.startswith("run record: ")]
        return Path(line.removeprefix("run record: ")).parent.name

    def comparison(self, run_id: str) -> dict[str, Any]:
        return json.loads((self.runs / run_id / "comparison.json").read_text())

    def bisect(self, run_id: str, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        out = self("bisect", run_id, *args)
        lines = [line for line in out.stdout.splitlines() if line.startswith("bisect record: ")]
        assert lines, out.stdout + out.stderr
        document = json.loads(Path(lines[0].removeprefix("bisect record: ")).read_text())
        jsonschema.validate(document, json.loads(BISECT_SCHEMA_PATH.read_text()))
        return out, document


def stage_flow_runs(bisect_id: str) -> list[str]:
    """The stage subflows the bisect's flow run started, by name, in order."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[bisect_id]))
        )
        names = {r.flow_id: client.read_flow(r.flow_id).name for r in runs}
    return [names[r.flow_id] for r in sorted(runs, key=lambda r: r.created)]
