"""The image flow on the test bed: real Podman engines behind the Docker API over SSH, the bed registry.

The bed's image is the vLLM stand-in (testbed/standin): `pip show` and `vllm serve --help` inside it
answer like the real ones, so the probes run for real.
"""

from __future__ import annotations

import contextlib
import io
import random
import shlex
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from k3deploy.core.errors import ImageStageFailed, K3DeployError
from k3deploy.flows.image import image
from k3deploy.tasks.transport import docker_client
from tests.bedconfig import bed_config, bed_transports, write_config

pytestmark = [pytest.mark.image, pytest.mark.testbed, pytest.mark.prefect]
LOADED = "k3test/loaded:1"


@pytest.fixture
def engines(testbed) -> Iterator[dict[str, Any]]:
    transports = bed_transports(testbed)
    clients = {name: docker_client(t) for name, t in transports.items()}
    yield {"transports": transports, "clients": clients}
    for name, client in clients.items():
        for ref in (LOADED, "k3test/built:1"):
            with contextlib.suppress(Exception):
                client.images.remove(ref, force=True)
        client.close()
        transports[name].close()


def run_image(tmp_path: Path, bed, **changes: Any) -> dict[str, Any]:
    data = bed_config(bed, **changes)
    result = image(config=write_config(tmp_path / f"deploy-{random.randrange(10**9)}.yaml", data))
    return result.data | {"verdict": result.verdict.value}


def pinned(bed) -> dict[str, Any]:
    repository = bed.image_ref_by_digest.split("@")[0]
    return {"image__ref": f"{repository}:1", "image__digest": bed.image_digest}


def test_pinned_image_is_pulled_everywhere_and_probed(prefect_server, testbed, engines, tmp_path):
    record = run_image(tmp_path, testbed, **pinned(testbed))
    assert record["verdict"] == "pass" and record["digest"] == testbed.image_digest
    assert set(record["nodes"]) == {"node0", "node1", "node2", "node3"}
    assert set(record["nodes"].values()) == {record["image_id"]}
    assert set(record["versions"]) == {"vllm", "vllm-ascend"} and all(record["versions"].values())
    checks = {f["check"]: f["ok"] for f in record["findings"]}
    assert checks == {
        "vllm installed": True,
        "vllm-ascend installed": True,
        "serve.tokenizer_mode": True,
        "serve.tool_call_parser": True,
        "serve.reasoning_parser": True,
    }
    left = engines["clients"]["node0"].containers.list(all=True, filters={"label": "k3deploy.probe"})
    assert left == []  # the probe containers are gone


def test_missing_image_fails_naming_every_node_and_the_registry_answer(prefect_server, testbed, tmp_path):
    absent = "sha256:" + "0" * 64
    with pytest.raises(K3DeployError) as failed:
        run_image(tmp_path, testbed, **(pinned(testbed) | {"image__digest": absent}))
    message = str(failed.value)
    assert "failed on 4 node(s)" in message
    for node in ("node0", "node1", "node2", "node3"):
        assert f"{node}: pulling {pinned(testbed)['image__ref']}@{absent} failed: " in message


@pytest.mark.faults
def test_a_registry_that_is_down_fails_the_pull_naming_every_node_and_the_registry(prefect_server, testbed, tmp_path):
    """Nothing listens at the registry's address (on the bed's bridge): every node's engine says so."""
    down = "10.213.0.250:5000"
    repository = pinned(testbed)["image__ref"].split("/", 1)[1]
    with pytest.raises(K3DeployError) as failed:
        run_image(tmp_path, testbed, image__ref=f"{down}/{repository}", image__digest=testbed.image_digest)
    message = str(failed.value)
    assert "failed on 4 node(s)" in message
    for node in ("node0", "node1", "node2", "node3"):
        assert f"{node}: pulling {down}/{repository}@{testbed.image_digest} failed: " in message
    assert message.count(down) >= 4


def _build(client, tag: str, dockerfile: str) -> str:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    built, _ = client.images.build(fileobj=context, custom_context=True, tag=tag, rm=True)
    return built.id


def test_an_image_different_on_the_fourth_node_is_caught(prefect_server, testbed, engines, tmp_path):
    clients = engines["clients"]
    for name in ("node0", "node1", "node2"):
        clients[name].images.pull(testbed.image_ref_by_digest.split("@")[0], tag=testbed.image_digest)
        clients[name].images.get(testbed.image_ref_by_digest).tag(*LOADED.split(":"))
    other = _build(clients["node3"], LOADED, f"FROM {testbed.image_ref_by_digest}\nRUN echo patched > /patched\n")
    with pytest.raises(ImageStageFailed) as failed:
        run_image(
            tmp_path,
            testbed,
            image__ref=LOADED,
            image__digest=None,
            image__allow_unpinned=True,
            image__pull_policy="never",
        )
    message = str(failed.value)
    assert f"node3: same image: holds image {other[:19]} for {LOADED}; node0, node1, node2 hold " in message
    assert not any(f"{n}: same image" in message for n in ("node0", "node1", "node2"))


def test_image_built_from_a_vllm_ascend_revision_reaches_every_node(prefect_server, testbed, engines, tmp_path):
    node0 = engines["transports"]["node0"]
    src = "/srv/src/vllm-ascend"
    vllm_commit = "0123456789abcdef0123456789abcdef01234567"
    dockerfile = f"FROM {testbed.image_ref_by_digest}\\nARG VLLM_COMMIT\\nRUN echo $VLLM_COMMIT > /vllm-commit\\n"
    script = " && ".join(
        [
            f"rm -rf {src} && mkdir -p {src}/.github && cd {src} && git init -q",
            f"printf {shlex.quote(dockerfile)} > Dockerfile.a3",
            f"echo {vllm_commit} > .github/vllm-main-verified.commit",
            "git add -A && git -c user.name=k3 -c user.email=k3@test commit -qm v1 && git tag v1",
            "git rev-parse HEAD",
        ]
    )
    source = node0.run(script, 60).check().stdout.strip()
    try:
        build = {"repo_url": src, "revision": "v1", "tag": "k3test/built:1"}
        record = run_image(tmp_path, testbed, image__build=build)
    finally:
        node0.run(f"rm -rf {src}", 30)
    assert (record["source_revision"], record["vllm_commit"]) == (source, vllm_commit)
    assert set(record["nodes"]) == {"node0", "node1", "node2", "node3"}
    assert set(record["nodes"].values()) == {record["image_id"]}  # save/load gave every node the same id
    inside = engines["clients"]["node3"].containers.run(
        "k3test/built:1", ["cat", "/vllm-commit"], entrypoint=[], remove=True
    )
    assert inside.decode().strip() == vllm_commit  # the build argument came from the checkout's file
    assert node0.run("ls /var/tmp/k3deploy-build", 30).stdout.strip() == ""  # the checkout was cleaned up


def test_a_failed_build_names_the_build_host_and_leaves_no_checkout(prefect_server, testbed, engines, tmp_path):
    node0 = engines["transports"]["node0"]
    src = "/srv/src/vllm-ascend-broken"
    dockerfile = f"FROM {testbed.image_ref_by_digest}\\nRUN exit 7\\n"
    script = " && ".join(
        [
            f"rm -rf {src} && mkdir -p {src}/.github && cd {src} && git init -q",
            f"printf {shlex.quote(dockerfile)} > Dockerfile.a3",
            "echo 0123456789abcdef0123456789abcdef01234567 > .github/vllm-main-verified.commit",
            "git add -A && git -c user.name=k3 -c user.email=k3@test commit -qm v1",
        ]
    )
    node0.run(script, 60).check()
    try:
        with pytest.raises(K3DeployError, match="node0: command exited") as failed:
            run_image(tmp_path, testbed, image__build={"repo_url": src, "revision": "HEAD", "tag": "k3test/built:1"})
    finally:
        node0.run(f"rm -rf {src}", 30)
    assert "build" in str(failed.value)
    assert node0.run("ls -A /var/tmp/k3deploy-build", 30).stdout.strip() == ""  # removed although the build failed


def test_the_probe_runs_the_way_launch_starts_vllm(testbed, engines):
    """Its environment scripts sourced, the serving container's devices and mounts given (a real Podman engine)."""
    from k3deploy.blocks.serve import SEED_SETUP
    from k3deploy.tasks.image.engine import run_in_image
    from k3deploy.tasks.render import entry_argv

    client = engines["clients"]["node0"]
    image_id = client.images.pull(testbed.image_ref_by_digest).id
    look = ["sh", "-c", 'ls /dev/davinci0 /usr/local/Ascend/driver/version.info && echo "toolkit=$ASCEND_TOOLKIT_HOME"']
    mounts = ["/usr/local/Ascend/driver:/usr/local/Ascend/driver"]
    code, out = run_in_image(client, "node0", image_id, entry_argv(SEED_SETUP, look), 60, ["/dev/davinci0"], mounts)
    assert code == 0 and "toolkit=/usr/local/Ascend/ascend-toolkit/latest" in out, out
    code, out = run_in_image(client, "node0", image_id, look, 60)  # a bare container sees neither
    assert code != 0 and "toolkit=" not in out
