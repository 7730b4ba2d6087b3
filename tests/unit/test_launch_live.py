"""What a rank runs against its plan (pure): the readers of the runtimes' real answers and the key-by-key judge.

The readers' inputs are real: Podman's Docker-API inspect of a container started as launch starts one
(tests/data/launch/podman-inspect-standin.json) and the process runtime's /proc reading of a real process
(tests/data/launch/proc-read-sleep.bin); docs/SOURCES.md says how each was made.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.tasks.live_server import (
    LiveServer,
    differences,
    from_inspect,
    from_proc,
    inspected_device,
    options,
    pinned,
)
from k3deploy.tasks.render import render_plan
from tests.configs import site_data

pytestmark = pytest.mark.launch
DATA = Path(__file__).parents[1] / "data" / "launch"


def plan_nodes(runtime: str = "docker"):
    data = site_data()
    data["serve"]["runtime"] = runtime
    return render_plan(DeploymentConfig.model_validate(data)).nodes


def test_argv_as_keys_flags_with_their_values_switches_and_positional_arguments():
    argv = ["vllm", "serve", "/m", "--a", "1", "--b=2", "--switch", "--c", "x", "--a", "3"]
    assert options(argv) == {
        "arg 0": ["vllm"],
        "arg 1": ["serve"],
        "arg 2": ["/m"],
        "--a": ["1", "3"],
        "--b": ["2"],
        "--switch": [""],
        "--c": ["x"],
    }


def test_a_rank_running_its_plan_has_no_difference_whatever_else_its_environment_holds():
    node = plan_nodes()[1]
    spec = node.container
    assert spec is not None
    devices = [inspected_device(d) for d in spec.devices]
    live = LiveServer(list(spec.command), spec.environment | {"PATH": "/usr/bin"}, spec.image, devices)
    assert spec.devices and differences(node, live) == []
    assert differences(node, replace(live, devices=devices[::-1])) == []  # the order is not the plan's to judge


def test_each_changed_flag_variable_image_and_device_is_named():
    node = plan_nodes()[1]
    spec = node.container
    assert spec is not None
    command = list(spec.command)
    command[command.index("--max-num-seqs") + 1] = "3"
    command.append("--enforce-eager")
    env = dict(spec.environment)
    env["HCCL_BUFFSIZE"] = "1"
    del env["HCCL_BUFFSIZE_EP"]
    devices = [inspected_device(d) for d in spec.devices]
    live = LiveServer(command, env, "other/image:1", devices[1:])
    found = differences(node, live)
    assert "flag --max-num-seqs: '3' running, the plan says '16'" in found
    assert "flag --enforce-eager: (set) running, the plan says absent" in found
    assert "env HCCL_BUFFSIZE: '1' running, the plan says '1024'" in found
    assert "env HCCL_BUFFSIZE_EP: unset running, the plan says '2048'" in found
    assert f"image: 'other/image:1' running, the plan says {spec.image!r}" in found
    assert any(f.startswith("devices: ") for f in found)


def test_a_process_run_through_its_console_script_is_its_plan():
    node = plan_nodes("process")[1]
    spec = node.process
    assert spec is not None
    venv = spec.environment["VIRTUAL_ENV"]
    argv = [f"{venv}/bin/python3", f"{venv}/bin/{spec.command[0]}", *spec.command[1:]]
    assert differences(node, LiveServer(argv, dict(spec.environment))) == []
    wrapped = ["python3", "/opt/site/vllm_wrapper.py", *spec.command[1:]]  # a site's wrapper exec'ing python
    assert differences(node, LiveServer(wrapped, dict(spec.environment))) == []
    shifted = [f"{venv}/bin/python3", f"{venv}/bin/vllm", "serve", "/elsewhere", *spec.command[3:]]
    assert differences(node, LiveServer(shifted, dict(spec.environment))) == [
        f"arg 2: '/elsewhere' running, the plan says {spec.command[2]!r}"
    ]


def test_the_docker_api_inspect_of_a_real_container_reads_back_command_environment_image_and_devices():
    attrs = json.loads((DATA / "podman-inspect-standin.json").read_text())
    live = from_inspect(attrs)
    assert live.argv == attrs["Config"]["Cmd"] and live.argv[3:6] == ["k3deploy-entry", "vllm", "serve"]
    assert live.env["HCCL_BUFFSIZE"] == "1024" and "PATH" in live.env  # the image's own variables are there too
    assert live.source == attrs["Config"]["Image"]
    assert live.devices[0] == "/dev/davinci0" and len(live.devices) == len(attrs["HostConfig"]["Devices"])
    # Podman resolves the bed's linked device (its host path reads /dev/null) and drops the tag of a pinned ref:
    assert attrs["HostConfig"]["Devices"][0]["PathOnHost"] == "/dev/null" and ":1@" not in live.source


def test_a_pinned_reference_is_its_repository_and_digest_whatever_the_tag():
    assert pinned("reg:5000/k3/img:1@sha256:ab") == pinned("reg:5000/k3/img@sha256:ab") == "reg:5000/k3/img@sha256:ab"
    assert pinned("reg:5000/k3/img:1") == "reg:5000/k3/img:1" and pinned(None) is None
    assert pinned("reg:5000/k3/img@sha256:ab") != pinned("reg:5000/k3/other@sha256:ab")


def test_the_proc_reading_of_a_real_process_gives_its_argv_and_environment():
    live = from_proc((DATA / "proc-read-sleep.bin").read_bytes().decode())
    assert live.argv == ["sleep", "300"]
    assert live.env == {"PATH": "/usr/bin:/bin", "PWD": "/tmp/procdemo", "K3_A": "1", "K3_B": "two words"}
    assert from_proc("#exited\n") is None  # the server has ended: the launch's exit watch names it


def test_a_container_run_by_digest_on_a_node_that_also_has_the_tag_runs_what_the_plan_says():
    attrs = json.loads((DATA / "podman-inspect-by-digest-tagged.json").read_text())
    image = json.loads((DATA / "podman-inspect-image-tagged.json").read_text())
    digest_ref = image["RepoDigests"][0]
    assert attrs["Config"]["Image"] == image["RepoTags"][0]  # Podman names the tag, though it ran the digest
    node = plan_nodes()[1]
    spec = node.container
    assert spec is not None
    node = replace(node, container=replace(spec, image=digest_ref.replace("@", ":1@")))  # repo:tag@digest planned
    devices = [inspected_device(d) for d in spec.devices]
    live = replace(from_inspect(attrs, image["RepoDigests"]), argv=list(spec.command), env=dict(spec.environment),
                   devices=devices)  # fmt: skip
    assert live.source == "10.213.0.1:5000/k3deploy/testimg:1" and differences(node, live) == []
    # without the engine's digests the tag alone cannot say so, and another digest is still named
    assert differences(node, replace(live, digests=[])) == [
        f"image: {live.source!r} running, the plan says {digest_ref.replace('@', ':1@')!r}"
    ]
    assert len(differences(node, replace(live, digests=[digest_ref[:-4] + "0000"]))) == 1
