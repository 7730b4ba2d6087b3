"""The comm flow on the local profile, on this machine (no bed): no NPUs declared, so the host checks
run for both nodes and every NPU group is reported not applicable, with the reason."""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.core.stage import Verdict
from k3deploy.flows.comm import comm
from k3deploy.tasks.comm.checks import NPU_GROUPS
from k3deploy.tasks.comm.report import CommReport, NotApplicable
from tests.bedconfig import write_config
from tests.prefect_runs import latest_artifact, task_states

pytestmark = [pytest.mark.comm, pytest.mark.prefect]
LOCAL = Path(__file__).parents[2] / "configs" / "local.yaml"
REASON = "cluster.npus_per_node is 0: no NPUs declared"
comm_flow = importlib.import_module("k3deploy.flows.comm")  # the module, not the flow it defines


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (the kernel's picks, held together so they differ)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def local_profile(tmp_path: Path) -> dict[str, Any]:
    """configs/local.yaml declaring no NPUs, both nodes at 127.0.0.1 on lo, free ports, model root in tmp_path."""
    data = yaml.safe_load(LOCAL.read_text())
    service, rpc = free_ports(2)
    data["cluster"].update(
        transport="local",
        npus_per_node=0,
        model_root=str(tmp_path / "models"),
        nodes=[{"name": f"local{i}", "address": "127.0.0.1", "nic": "lo"} for i in range(2)],
    )
    data["serve"].update(service_port=service, rpc_port=rpc)
    return data


def test_local_profile_runs_the_host_checks_and_reports_the_npu_checks_not_applicable(prefect_server, tmp_path):
    data = local_profile(tmp_path)
    path = write_config(tmp_path / "local.yaml", data)
    state = comm(config=path, fresh=True, return_state=True)
    assert state.is_completed() and task_states(state)["comm checks"] == "Completed"
    result = state.result()
    assert result.verdict is Verdict.PASS and not result.failures
    assert {(f.subject, f.check) for f in result.findings} == {
        ("local0", "nic"), ("local0", "local_ip"), ("local0", "service_port"), ("local0", "rpc_port"),
        ("local1", "nic"), ("local1", "local_ip"),
    }  # fmt: skip
    assert {f.detail for f in result.findings if f.check == "local_ip"} == {"lo owns LOCAL_IP 127.0.0.1"}
    ports = {f.check: f.detail for f in result.findings if f.subject == "local0" and f.check.endswith("_port")}
    assert ports == {name: f"port {data['serve'][name]} is free" for name in ("service_port", "rpc_port")}
    na = result.data["not_applicable"]
    assert [g["group"] for g in na] == [group for group, _ in NPU_GROUPS]
    assert {g["reason"] for g in na} == {REASON}
    assert {c for g in na for c in g["checks"]} >= {
        "npu_smi",
        "lldp",
        "spod_info",
        "hccn_conf",
        "ping",
        "driver_version",
    }
    assert result.summary == "comm OK: 6 host checks on 2 nodes, 0 failed; NPU checks not applicable (no NPUs declared)"
    summary = latest_artifact("comm-summary")
    assert f"- ping mesh (ping, hccs_ping): not applicable: {REASON}" in summary
    again = comm(config=path, return_state=True)  # the caching is unchanged: a pass is reused, n/a included
    assert task_states(again)["comm checks"] == "Cached" and again.result().data["not_applicable"] == na


def test_a_run_where_no_check_applies_is_not_applicable(prefect_server, tmp_path, monkeypatch):
    """Every check inapplicable (none ran): the stage's verdict is not-applicable, with the reason."""
    groups = tuple(NotApplicable(group, checks, REASON) for group, checks in NPU_GROUPS)
    report = CommReport(("local0", "local1"), (), {"local": 0.0, "pings": 0.0}, groups)

    class NothingRuns:
        def with_options(self, **_: Any) -> Any:
            return lambda cfg: report

    monkeypatch.setattr(comm_flow, "comm_checks", NothingRuns())
    result = comm(config=write_config(tmp_path / "local.yaml", local_profile(tmp_path)))
    assert (result.verdict, result.reason) == (Verdict.NOT_APPLICABLE, REASON)
    assert len(result.data["not_applicable"]) == len(NPU_GROUPS) and result.findings == []


def test_a_command_parses_its_config_once_and_hands_it_to_its_flows(prefect_server, tmp_path, monkeypatch):
    """`k3deploy rerun -c site.yaml comm`: the CLI's check before Prefect starts is the only parse; the cluster
    hold and the comm flow (given the path, as its parameter must be) get that config, and nothing stays."""
    from prefect.settings import PREFECT_API_URL
    from typer.testing import CliRunner

    from k3deploy.blocks import source as config_source
    from k3deploy.blocks.deployment import DeploymentConfig
    from k3deploy.cli.app import app

    path = write_config(tmp_path / "site.yaml", local_profile(tmp_path))
    validations = []
    plain = DeploymentConfig.model_validate

    def counted(data: Any, **kwargs: Any) -> DeploymentConfig:
        validations.append(1)
        return plain(data, **kwargs)

    monkeypatch.setattr(DeploymentConfig, "model_validate", counted)
    monkeypatch.setenv("K3DEPLOY_RUNS_DIR", str(tmp_path / "runs"))
    # The CLI puts its server in the environment (for the process it is): here the tests' server, and
    # monkeypatch puts the environment back, or later tests' threads would talk to another server.
    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    result = CliRunner().invoke(app, ["rerun", "-c", path, "comm", "--fresh", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert '"verdict": "pass"' in result.output
    assert os.environ["PREFECT_API_URL"] == PREFECT_API_URL.value()  # it ran on the tests' server
    assert len(validations) == 1
    assert config_source._PARSED == {}  # handed on only while the command ran
    config_source.resolve_config(path)  # the counter sees a parse: outside a command, a path is parsed
    assert len(validations) == 2
