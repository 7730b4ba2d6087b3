"""The local profile with the test bed's vLLM stand-in as its server: fast, and told to fail on demand.

The serving environment given to the pipeline is a folder that is the REAL vLLM environment
(its python, site-packages and k3deploy's marker, linked) except `bin/vllm`: `vllm serve` runs the
stand-in (testbed/standin/vllm_standin.py), anything else (`vllm bench serve`, the image probe's
imports) the real vLLM. So models (through the real hub client and the local hub), image, launch,
smoke and bench all run for real, with a server that starts in a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any
from uuid import uuid4

import yaml

from k3deploy.localprofile.checkpoint import write_checkpoint
from tests.ports import port_free
from tests.vllm_env import VLLM

ROOT = Path(__file__).parents[1]
PROFILE = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
STANDIN = ROOT / "testbed" / "standin" / "vllm_standin.py"
REAL_ENV = VLLM.parents[1]
# Each xdist worker's stand-in has ports of its own (gw0: 18300 and 13645, gw1: 19300 and 14645; its hub port + 80),
# so the stand-in's modules run on either worker, beside each other.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
PORT, RPC_PORT = 18300 + 1000 * _WORKER, 13645 + 1000 * _WORKER


def standin_env(folder: Path) -> Path:
    """A serving environment: the real one linked in, `bin/vllm` dispatching `serve` to the stand-in."""
    (folder / "bin").mkdir(parents=True)
    for item in REAL_ENV.iterdir() if REAL_ENV.is_dir() else ():  # without it, only `vllm serve` works
        if item.name != "bin":
            (folder / item.name).symlink_to(item)
    for item in (REAL_ENV / "bin").iterdir() if REAL_ENV.is_dir() else ():
        if item.name != "vllm":
            (folder / "bin" / item.name).symlink_to(item)
    script = folder / "bin" / "vllm"
    script.write_text(
        "#!/bin/sh\n# serve: the test bed's stand-in; anything else (bench): the real vLLM\n"
        f'if [ "$1" = serve ]; then exec python3 {shlex.quote(str(STANDIN))} "$@"; fi\n'
        f'exec {shlex.quote(str(VLLM))} "$@"\n'
    )
    script.chmod(0o755)
    return folder


def standin_profile(tmp_path: Path, *, hub: bool = False, port: int = PORT, rpc_port: int = RPC_PORT) -> dict[str, Any]:
    """The profile's data: stand-in server on `port`, checkpoints under tmp_path; `hub`: models downloads them
    from a local hub of the test's own on `port` + 80."""
    data = json.loads(json.dumps(PROFILE))
    data["cluster"]["model_root"] = str(tmp_path / "models")
    # A cluster lock of the test's own: no test waits on another's run (write_config bounds the wait too).
    data["cluster"] |= {"name": f"standin-{uuid4().hex[:8]}"}
    if hub:
        data["models"]["local_hub"] |= {"root": str(tmp_path / "hub"), "port": port + 80}
    else:
        write_checkpoint(tmp_path / "models" / "tiny-kimi-k3")  # the tokenizer the real bench loads
        del data["models"]["local_hub"]
    data["image"]["environment"]["path"] = str(standin_env(tmp_path / "env"))
    data["serve"] |= {
        "service_port": port,
        "rpc_port": rpc_port,
        "process": {"state_dir": str(tmp_path / "serving")},
        "readiness": {"timeout_s": 120, "poll_s": 0.5, "request_timeout_s": 10},
    }
    data["serve"]["env"] |= {"K3SIM_CONTROL_FILE": str(tmp_path / "control.json"), "K3SIM_STARTUP_S": "0.5"}
    data["smoke"] = {"request_timeout_s": 5, "burst_requests": 4}
    # The stand-in answers a tool call with fixed arguments and counts prompts in words: conformance is judged on
    # the real vLLM (the local profile's e2e module), its faults through a proxy in front of it
    # (tests/conformance_proxy.py).
    data["conformance"] = {"enabled": False}
    data["bench"] |= {"prefix_hit": False}
    return data


def bench_runs_left(tmp_path: Path) -> list[str]:
    """`vllm bench serve` processes of this test (its checkpoint path is in their command lines)."""
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            raw = cmdline.read_bytes()
            if str(tmp_path).encode() in raw and re.search(rb"bench[\0 ]serve", raw):
                left.append(raw.replace(b"\0", b" ").decode(errors="replace"))
    return left


def nothing_serving(tmp_path: Path) -> bool:
    return not any((tmp_path / "serving").glob("*/pid")) and port_free(PORT) and port_free(RPC_PORT)
