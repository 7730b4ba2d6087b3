"""`validate` when no node can be reached: preflight fails naming each node, every later stage is
skipped (never run against nodes that failed their checks), teardown still runs, the record says so."""

from __future__ import annotations

import json
import socket

import pytest

from k3deploy.core.errors import ValidateFailed
from k3deploy.core.paths import runs_dir
from k3deploy.flows.validate import validate
from tests.bedconfig import write_config
from tests.configs import site_data

pytestmark = [pytest.mark.e2e, pytest.mark.prefect, pytest.mark.faults, pytest.mark.usefixtures("runs_dir"),
              pytest.mark.anywhere]  # fmt: skip


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nobody listens once the socket is closed


def test_an_unreachable_cluster_fails_preflight_and_skips_every_later_stage(prefect_server, tmp_path):
    data = site_data()
    for i, node in enumerate(data["cluster"]["nodes"]):
        node["address"] = node["local_ip"] = f"127.0.0.{i + 1}"
    data["cluster"]["ssh"] = {
        "port": closed_port(),
        "known_hosts": str(tmp_path / "known_hosts"),
        "connect_timeout_s": 1,
    }
    state = validate(config=write_config(tmp_path / "site.yaml", data), return_state=True)
    with pytest.raises(ValidateFailed, match=r"^validate failed at preflight: 4 fact\(s\) failed on node0, node1"):
        state.result()
    record = json.loads((runs_dir() / str(state.state_details.flow_run_id) / "record.json").read_text())
    verdicts = {s["stage"]: s["verdict"] for s in record["stages"]}
    assert verdicts["preflight"] == "fail" and record["failed_stage"] == "preflight"
    assert record["failure"]["failure_class"] == "infrastructure"  # the site's problem, not the deployment's
    assert record["failure"]["evidence"].startswith("node0: "), record["failure"]
    assert [verdicts[s] for s in ("models", "comm", "image", "launch")] == ["skipped"] * 4
    assert verdicts["teardown"] == "fail"  # it ran, and says it could not reach the nodes
    skipped = next(s for s in record["stages"] if s["stage"] == "image")
    assert skipped["reason"] == "not run: preflight failed"
