"""`k3deploy run -c configs/local.yaml` as a person runs it (the README's main job): the terminal shows the
stage lines and the table, and Prefect's log stream goes to the run's log file, not the terminal. A run refused
at preflight here; a passing run is test_local_profile_e2e.py's first test, which asks its server after."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from k3deploy.blocks.loader import load_config
from tests.cli_run import STAGES, assert_quiet, k3deploy_run, log_file, table_rows

pytestmark = [pytest.mark.cli, pytest.mark.e2e, pytest.mark.prefect]
PROFILE = Path(__file__).parents[2] / "configs" / "local.yaml"


def test_a_run_refused_at_preflight_prints_its_reason_and_the_table_and_no_traceback(prefect_server, tmp_path):
    port = load_config(str(PROFILE)).serve.service_port
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        out = k3deploy_run(PROFILE, tmp_path)
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
    assert len(out.stdout.splitlines()) <= 34, out.stdout  # the table's rows and where the record and log are
    words = " ".join(out.stdout.split())  # the table's terminal may wrap the line
    assert f"failed at preflight: infrastructure: local0: ports: service_port {port} is taken" in words, out.stdout
    text = log_file(out.stdout).read_text()
    assert "Finished in state Failed" in text  # Prefect's own account of the failure is in the file
