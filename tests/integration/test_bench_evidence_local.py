"""Bench on the local profile with the real CPU vLLM: a rank's tracked process killed during bench (the engine
left running) fails the stage and teardown leaves nothing of its group. Cells judged VALID from the real
prefix-cache counters, with repeats, spread and goodput, are test_local_profile_e2e.py's (on its shared
service); a prefix cell measured with prefix caching off (INVALID) is test_smoke_bench_faults.py's."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.blocks.loader import load_config
from k3deploy.core.errors import ValidateFailed
from k3deploy.core.paths import runs_dir
from k3deploy.flows.validate import validate
from tests.bedconfig import write_config
from tests.ports import in_this_netns

pytestmark = [pytest.mark.bench, pytest.mark.vllm, pytest.mark.prefect, pytest.mark.usefixtures("runs_dir")]
PROFILE = Path(__file__).parents[2] / "configs" / "local.yaml"
STAGES = ["models", "launch", "bench"]


def profile(tmp_path: Path, serve: dict[str, Any] | None = None, **bench: Any) -> str:
    data = yaml.safe_load(PROFILE.read_text())
    data["serve"] |= serve or {}
    data["bench"] |= bench
    return write_config(tmp_path / "local.yaml", data)


def bench_stage(run_id: Any) -> dict[str, Any]:
    document = json.loads((runs_dir() / str(run_id) / "record.json").read_text())
    return next(s for s in document["stages"] if s["stage"] == "bench")


def group_alive(pgid: int) -> list[str]:
    """Live (not zombie) processes of a process group, from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone while we looked
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(stat.parent.name)
    return alive


def test_killing_a_ranks_tracked_process_during_bench_fails_it_and_teardown_leaves_none_of_its_group(
    prefect_server, tmp_path
):
    config = profile(tmp_path, num_prompts=400, prefix_hit=False)  # long enough to be killed in
    cfg = load_config(config)
    pid_file = Path(cfg.serve.process.state_dir) / "vllm-kimi-k3-local1" / "pid"
    env = cfg.image.environment.path.encode()
    killed: dict[str, int] = {}

    def kill_once_bench_runs() -> None:
        """Once `vllm bench serve` runs, SIGKILL rank 1's tracked wrapper only: its engine runs on, re-parented."""
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    text = cmdline.read_bytes()
                except OSError:
                    continue
                if b"bench\0serve" in text and env in text and pid_file.exists() and in_this_netns(cmdline.parent):
                    leader = int(pid_file.read_text())
                    os.kill(leader, signal.SIGKILL)
                    killed["pgid"] = leader
                    return
            time.sleep(0.5)  # a state of other processes: nothing to wait on but /proc

    killer = threading.Thread(target=kill_once_bench_runs, daemon=True)
    killer.start()
    state = validate(config=config, only=STAGES, return_state=True)
    killer.join(60)
    assert "pgid" in killed
    with pytest.raises(ValidateFailed, match=r"validate failed at bench: .*local1.*DP rank 1"):
        state.result()
    document = json.loads((runs_dir() / str(state.state_details.flow_run_id) / "record.json").read_text())
    stages = {s["stage"]: s for s in document["stages"]}
    assert stages["teardown"]["verdict"] == "pass", stages["teardown"]
    assert group_alive(killed["pgid"]) == []  # the engine and its workers too, not only the wrapper
    assert not pid_file.parent.exists()
