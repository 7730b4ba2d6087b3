"""The container runtime with the REAL CPU vLLM: two bed hosts' Podman engines through the Docker API, DP 2
across their network namespaces, the scripted checkpoint answering a chat through node 0's address; smoke
passes against it and bench runs the real `vllm bench serve` inside node 0's container.

The image is the bed's runner (testbed/standin/runner.py): the stand-in's root filesystem with the
host libraries vLLM needs; the local profile's vLLM environment is bind-mounted read-only at its
own path (bed hosts share the controller's /var/tmp) and comes first on PATH. Each host's model
root (/srv) is private, so the checkpoint is written into each one.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from k3deploy.flows.bench import bench
from k3deploy.flows.launch import launch
from k3deploy.flows.smoke import smoke
from k3deploy.flows.teardown import teardown
from k3deploy.localprofile.checkpoint import write_checkpoint
from k3deploy.tasks.containers import RUN_LABEL
from k3deploy.tasks.tool_call import QUESTION, TOOL_SCHEMA
from testbed.standin.runner import publish_runner
from tests import vllm_env
from tests.bedconfig import bed_config, write_config
from tests.launchbed import NAME, ours

ROOT = Path(__file__).parents[2]
PROFILE = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
VLLM_ENV = str(vllm_env.VLLM_ENV)
RUNNER = "10.213.0.1:5000/k3deploy/vllm-cpu-runner:1"
CHECKPOINT = "tiny-kimi-k3"
NODES = ["node0", "node1"]
VLLM_CACHE = "/var/cache/vllm"  # in the container; each node's /srv/vllm-cache

pytestmark = [
    pytest.mark.launch,
    pytest.mark.testbed,
    pytest.mark.vllm,
    pytest.mark.prefect,
    pytest.mark.usefixtures("runs_dir"),
    vllm_env.needs_vllm_env,
]


@pytest.fixture(scope="module")
def runner(testbed) -> Iterator[str]:
    """The runner image pushed to the bed registry, and the checkpoint in node0's and node1's model roots."""
    image = publish_runner(RUNNER, Path(testbed.state.state_dir))
    folders = [Path(testbed.host(n).srv_dir) / "models" / CHECKPOINT for n in NODES]
    for folder in folders:
        write_checkpoint(folder, scripted=True)
        (folder.parents[1] / "vllm-cache").mkdir(exist_ok=True)
    yield f"{RUNNER.rsplit(':', 1)[0]}@{image.digest}"
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(folder.parents[1] / "vllm-cache", ignore_errors=True)


def config(bed, image: str, tmp_path: Path) -> str:
    """The local profile's serving settings on two bed hosts, with the container runtime and the runner image."""
    serve = {k: v for k, v in PROFILE["serve"].items() if k not in ("runtime", "host", "container")}
    serve["env"] = {
        **serve["env"],
        "PATH": f"{VLLM_ENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HF_HUB_OFFLINE": "1",
    }
    serve["readiness"] = {**serve["readiness"], "poll_s": 1}
    data = bed_config(bed, hosts=2, serve=serve, cluster__npus_per_node=0)
    data["models"]["target"] = {"repo": f"k3deploy/{CHECKPOINT}", "revision": "main"}
    data["image"] = {"ref": image.split("@")[0] + ":1", "digest": image.split("@")[1]}
    # vLLM keeps what it learns of a model class under VLLM_CACHE_ROOT (modelinfos/); in a fresh container each of
    # its processes (API servers, engine) finds none and inspects the class in a subprocess that imports torch and
    # vLLM again. A folder on the node keeps it across processes and starts, as it would torch.compile's cache.
    data["serve"]["env"]["VLLM_CACHE_ROOT"] = VLLM_CACHE
    mounts = [f"{VLLM_ENV}:{VLLM_ENV}:ro", f"/srv/vllm-cache:{VLLM_CACHE}"]
    data["serve"]["container"] = {"devices": [], "mounts": mounts}
    # 20 short prompts, not the seed's 100 × 1024 tokens; the prefix-hit workload is test_local_profile_e2e's
    data["bench"] = PROFILE["bench"] | {"prefix_hit": False}
    return write_config(tmp_path / "deploy.yaml", data)


def finished_per_engine(metrics: str) -> dict[str, float]:
    """Engine label → requests it finished, from vLLM's Prometheus text (engines with none are left out)."""
    out: dict[str, float] = {}
    for match in re.finditer(r"^vllm:request_success_total\{([^}]*)\} (\S+)$", metrics, re.M):
        engine = re.search(r'engine="([^"]+)"', match.group(1))
        if engine is not None:
            out[engine.group(1)] = out.get(engine.group(1), 0.0) + float(match.group(2))
    return {k: v for k, v in out.items() if v > 0}


def chat(address: str, port: int, model: str) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [TOOL_SCHEMA],
        "tool_choice": "auto",
        "max_tokens": 64,
        "temperature": 0,
    }
    return httpx.post(f"http://{address}:{port}/v1/chat/completions", json=body, timeout=120).json()


def test_real_vllm_in_containers_on_two_bed_hosts_serves_dp2_across_their_namespaces(
    prefect_server, testbed, bed_nodes, runner, tmp_path
):
    clients = {n: bed_nodes["clients"][n] for n in NODES}
    for client in clients.values():  # the image stage's job; here only launch is under test
        client.images.pull(runner)
    deploy = config(testbed, runner, tmp_path)
    try:
        record = launch(config=deploy).data
        containers = {n: clients[n].containers.get(NAME) for n in NODES}
        assert {c.labels[RUN_LABEL] for c in containers.values()} == {record["run_id"]}
        assert all(c.status == "running" and c.image.id == clients[n].images.get(runner).id
                   for n, c in containers.items())  # fmt: skip
        assert record["time_to_ready_s"] is not None and record["burst_requests"] > 0
        seen = {(row["node"], row["milestone"]) for row in record["milestones"]}
        assert ("node0", "startup_complete") in seen and all((n, "weights_loaded") in seen for n in NODES)
        # Both ranks are the real vLLM from the mounted environment, each on its own namespace's address.
        for node, container in containers.items():
            argv, env = container.attrs["Config"]["Cmd"], container.attrs["Config"]["Env"]
            serve = argv[argv.index("k3deploy-entry") + 1 :]  # after the image's set_env.sh scripts are sourced
            assert serve[:2] == ["vllm", "serve"] and ("--headless" in serve) == (node != "node0")
            assert f"VLLM_HOST_IP={testbed.host(node).ip}" in env
        # Rank 1 answered requests from node1's namespace: vLLM counts finished requests per engine.
        node0 = f"http://{testbed.host('node0').ip}:{PROFILE['serve']['service_port']}"
        assert finished_per_engine(httpx.get(f"{node0}/metrics", timeout=30).text).keys() == {"0", "1"}

        answer = chat(testbed.host("node0").ip, PROFILE["serve"]["service_port"], PROFILE["serve"]["served_model_name"])
        message = answer["choices"][0]["message"]
        call = message["tool_calls"][0]["function"]
        assert call["name"] == TOOL_SCHEMA["function"]["name"] and json.loads(call["arguments"]) == {"city": "Paris"}
        assert message.get("reasoning") or message.get("reasoning_content")

        # smoke from here, and the real `vllm bench serve` inside node 0's container (docker exec), pass too
        checks = {c["check"]: c["verdict"] for c in smoke(config=deploy).data["checks"]}
        assert checks["tool call"] == checks["reasoning"] == checks["every DP rank"] == "pass"
        runs = bench(config=deploy).data["runs"]
        assert [(r["workload"], r["completed"], r["failed"]) for r in runs] == [("random", 20, 0)]
        leftover = clients["node0"].containers.get(NAME).exec_run(["ls", "benchmark-results"])
        assert leftover.exit_code != 0  # the saved JSON was taken into the run's folder, not left in the container
    finally:
        removed = teardown(config=deploy).data["removed"]
    assert removed == {n: [NAME] for n in NODES}
    assert not any(ours(bed_nodes).values())
