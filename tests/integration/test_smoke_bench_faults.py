"""Smoke and bench against the test bed's vLLM stand-in told to fail: the verdicts fail, with counts and names.

The stand-in (testbed/standin/vllm_standin.py) serves node 0 and one headless rank as processes on this
machine (the process runtime). `vllm bench serve` is the REAL one, from the local profile's vLLM
environment, so the failed count is the real tool's (tests/standin_profile.py).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.errors import BenchStageFailed, SmokeStageFailed
from k3deploy.flows.bench import bench
from k3deploy.flows.launch import launch
from k3deploy.flows.smoke import smoke
from k3deploy.flows.teardown import teardown
from tests.bedconfig import write_config
from tests.ports import port_free
from tests.standin_profile import standin_profile
from tests.vllm_env import needs_vllm_env

ROOT = Path(__file__).parents[2]
PROFILE = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
STANDIN = ROOT / "testbed" / "standin" / "vllm_standin.py"

pytestmark = [pytest.mark.faults, pytest.mark.prefect, pytest.mark.usefixtures("runs_dir")]


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The local profile with the stand-in as its server; (config path, the stand-in's control file)."""
    config = write_config(tmp_path / "standin.yaml", standin_profile(tmp_path))
    yield config, tmp_path / "control.json"
    teardown(config=config)
    assert not any((tmp_path / "serving").glob("*/pid")) and port_free(18300) and port_free(13645)


def with_expert_parallelism(config: str, tmp_path: Path) -> str:
    """The same deployment served with --enable-expert-parallel over its two DP ranks."""
    data = yaml.safe_load(Path(config).read_text())
    data["serve"] |= {"enable_expert_parallel": True, "expert_parallel_size": 2}
    return write_config(tmp_path / "ep.yaml", data)


def findings(failed: pytest.ExceptionInfo[Any]) -> dict[str, str]:
    return {f"{f.subject} {f.check}": f.detail for f in failed.value.result.findings if not f.ok}


@pytest.mark.bench
@pytest.mark.vllm
@needs_vllm_env
def test_bench_fails_with_the_failed_count_when_the_server_fails_a_share_of_requests(prefect_server, deployment):
    config, control = deployment
    launch(config=config)
    control.write_text(json.dumps({"K3SIM_FAIL_EVERY": "5"}))  # from now on every 5th request is a 500
    with pytest.raises(BenchStageFailed, match="1 check\\(s\\) failed") as failed:
        bench(config=config)
    assert findings(failed) == {"random c2 every request served": "16/20 completed, 4 failed"}
    run = failed.value.result.data["runs"][0]
    assert (run["completed"], run["failed"], run["failed_reported"]) == (16, 4, True)  # vLLM 0.32 reports it
    assert Path(failed.value.result.data["folder"], "random-c2.json").exists()  # the tool's own JSON, kept
    assert not Path("benchmark-results").exists()  # and not left on the node (here: bench's working folder)


@pytest.mark.smoke
def test_smoke_fails_naming_the_node_when_a_rank_dies_after_launch(prefect_server, deployment, tmp_path):
    config, _control = deployment
    launch(config=config)
    pid = int((tmp_path / "serving" / "vllm-kimi-k3-local1" / "pid").read_text())
    os.killpg(pid, signal.SIGKILL)  # the headless rank: node 0 says nothing and /health stays 200
    with pytest.raises(SmokeStageFailed) as failed:
        smoke(config=config)
    rank = findings(failed)["http://127.0.0.1:18300 every DP rank"]
    assert "requests failed (no answer within 5 s)" in rank and "finished no request: engine 1 (local1)" in rank
    assert "engine 0 (local0)" not in rank.split("finished no request:")[1]


@pytest.mark.launch
def test_with_expert_parallelism_node0_is_ready_only_after_the_slow_rank_joined(prefect_server, deployment, tmp_path):
    """EP: node 0 cannot finish start-up until every rank has loaded; launch waits for it, not for /health."""
    config, control = deployment
    ep_config = with_expert_parallelism(config, tmp_path)
    control.write_text(json.dumps({"K3SIM_STARTUP_S_DP1": 4}))  # the headless rank loads 8x slower than node 0
    result = launch(config=ep_config)
    seen = {(m["node"], m["milestone"]): m["seconds"] for m in result.data["milestones"]}
    assert seen[("local1", "kv_cache")] <= seen[("local0", "startup_complete")]
    assert seen[("local0", "kv_cache")] < seen[("local1", "kv_cache")]  # node 0 itself was done long before
    assert result.data["time_to_ready_s"] >= seen[("local1", "kv_cache")]
    teardown(config=ep_config)


@pytest.mark.smoke
def test_with_expert_parallelism_a_dead_rank_stalls_every_request(prefect_server, deployment, tmp_path):
    """EP: every step is an all-to-all over all ranks, so one dead rank stalls all requests, not a share."""
    config, _control = deployment
    ep_config = with_expert_parallelism(config, tmp_path)
    launch(config=ep_config)
    os.killpg(int((tmp_path / "serving" / "vllm-kimi-k3-local1" / "pid").read_text()), signal.SIGKILL)
    with pytest.raises(SmokeStageFailed) as failed:
        smoke(config=ep_config)
    bad = findings(failed)
    assert bad["http://127.0.0.1:18300 chat"] == "no answer within 5 s"  # whichever rank it was routed to
    assert bad["http://127.0.0.1:18300 every DP rank"].startswith("4 of 4 requests failed (no answer within 5 s)")
    teardown(config=ep_config)
