"""The local profile's models stage: k3deploy starts its own hub, the real hub client downloads, the hub stops.

Nothing runs before the command: the `models` flow (cluster.transport local, two nodes on this machine)
publishes the `generate` checkpoint on a hub of its own, lists it with `huggingface_hub`, downloads and
verifies it with the node agent on this machine, and stops the hub. The checkpoint here is a few small
files of the test's own (the real generator is k3deploy.localprofile's, exercised by the e2e test).
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.blocks import parse_config
from k3deploy.core.errors import ModelsStageFailed
from k3deploy.core.stage import failure_lines
from k3deploy.flows.models import models
from k3deploy.localhub import HubServer, publish, resolve
from k3deploy.tasks.models import localhub
from k3deploy.tasks.node.node_agent import MANIFEST_NAME
from tests.bedconfig import write_config
from tests.ports import port_free
from tests.prefect_runs import task_states

pytestmark = pytest.mark.models
LOCAL = Path(__file__).parents[2] / "configs" / "local.yaml"
REPO = "k3test/tiny-local"


def small_checkpoint(folder: Path, kind: str) -> None:
    """What the content checks need: config, tokenizer and processor files, one small safetensors shard."""
    data = (b"\x01" if kind == "scripted" else b"\x02") * 64
    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, len(data)]}}).encode()
    files = {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 64}).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": {}}}).encode(),
        "tokenizer_config.json": b'{"tokenizer_class": "PreTrainedTokenizerFast"}',
        "preprocessor_config.json": b'{"image_processor_type": "none"}',
        "model.safetensors": struct.pack("<Q", len(header)) + header + data,
    }
    for name, body in files.items():
        (folder / name).write_bytes(body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def generated(monkeypatch) -> list[tuple[str, str]]:
    """Every checkpoint generated: (folder name, kind); the small stand-in writes the files."""
    calls: list[tuple[str, str]] = []

    def generate(folder: Path, kind: str) -> None:
        calls.append((folder.name, kind))
        small_checkpoint(folder, kind)

    monkeypatch.setattr(localhub, "generate_checkpoint", generate)
    return calls


@pytest.fixture
def servers(monkeypatch) -> list[HubServer]:
    """Every hub the stage started, kept so the test can read its request log after the stage."""
    started: list[HubServer] = []

    class Recorded(HubServer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(localhub, "HubServer", Recorded)
    return started


def local_profile(tmp_path: Path, port: int, **hub: Any) -> dict[str, Any]:
    """configs/local.yaml with its model root and hub under tmp_path and the hub on `port`."""
    data = yaml.safe_load(LOCAL.read_text())
    data["cluster"]["model_root"] = str(tmp_path / "models")
    data["models"].pop("hub_endpoint", None)  # derived from local_hub
    data["models"]["node_python"] = sys.executable
    data["models"]["target"] = {"repo": REPO, "revision": "main"}
    data["models"]["local_hub"] = {"root": str(tmp_path / "hub"), "port": port, "generate": {REPO: "scripted"}, **hub}
    return data


def hf_requests(server: HubServer) -> dict[str, list[str]]:
    """The hub's request log by HF endpoint: listing, tree, file downloads (GET resolve); ModelScope's apart."""
    out: dict[str, list[str]] = {"info": [], "tree": [], "download": [], "modelscope": []}
    for r in server.requests:
        path = r.path.split("?", 1)[0]
        if path.startswith("/api/v1/"):
            out["modelscope"].append(path)
        elif path.startswith(f"/api/models/{REPO}/tree/"):
            out["tree"].append(path)
        elif path.startswith(f"/api/models/{REPO}"):
            out["info"].append(path)
        elif r.method == "GET" and path.startswith(f"/{REPO}/resolve/"):
            assert r.status == 200, r
            out["download"].append(path.rsplit("/", 1)[1])
    return out


@pytest.mark.prefect
def test_models_stage_publishes_serves_downloads_and_stops_its_own_hub(
    prefect_server, tmp_path, generated, servers
) -> None:
    port = free_port()
    config = write_config(tmp_path / "local.yaml", local_profile(tmp_path, port))
    assert port_free(port)  # nothing is running before the command

    result = models(config=config)

    assert result.verdict.value == "pass", failure_lines(result.findings)
    assert [kind for _, kind in generated] == ["scripted"]
    commit = resolve(tmp_path / "hub", REPO, "main")
    assert commit.message == localhub.generated_by("scripted")
    assert commit.message.startswith("k3deploy generated a scripted checkpoint (generator ")
    target = result.data["checkpoints"][0]
    assert (target["repo"], target["commit"], target["files"]) == (REPO, commit.sha, 5)
    assert {r["node"]: r["downloaded files"] for r in target["nodes"]} == {"local0": 5}  # shared root: once
    checks = {c["check"]: c["ok"] for c in result.data["checks"]}
    assert checks == {"tokenizer files": True, "processor files": True, "serve.max_model_len": True}

    [server] = servers
    seen = hf_requests(server)
    assert seen["info"] == [f"/api/models/{REPO}/revision/main"]  # huggingface_hub's model_info
    assert seen["tree"] == [f"/api/models/{REPO}/tree/{commit.sha}"]  # its list_repo_tree, by commit
    assert sorted(seen["download"]) == sorted(commit.files)  # every file, once, by its resolve URL
    assert seen["modelscope"] == []

    held = tmp_path / "models" / REPO.split("/")[1]
    for path, entry in commit.files.items():
        assert hashlib.sha256((held / path).read_bytes()).hexdigest() == entry.sha256
    assert json.loads((held / MANIFEST_NAME).read_text())["commit"] == commit.sha
    assert port_free(port)  # stopped after the stage

    state = models(config=config, return_state=True)

    assert state.is_completed()
    assert len(generated) == 1  # published already: not generated again
    assert resolve(tmp_path / "hub", REPO, "main").sha == commit.sha
    assert len(servers) == 2 and hf_requests(servers[1])["download"] == []  # nothing downloaded
    assert "fetch checkpoint" not in task_states(state)
    assert port_free(port)


@pytest.mark.prefect
def test_a_taken_port_fails_the_stage_naming_the_port_before_anything_is_generated(
    prefect_server, tmp_path, generated
) -> None:
    port = free_port()
    config = write_config(tmp_path / "local.yaml", local_profile(tmp_path, port))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(ModelsStageFailed) as failed:
            models(config=config)
    assert f"127.0.0.1 port {port}" in str(failed.value) and "port is taken" in str(failed.value)
    assert "models.local_hub.port" in str(failed.value)
    assert generated == []


def models_config(tmp_path: Path, port: int, **hub: Any):
    return parse_config(local_profile(tmp_path, port, **hub), environ={}).models


def test_without_a_local_hub_nothing_is_started(tmp_path, servers) -> None:
    data = local_profile(tmp_path, free_port())
    del data["models"]["local_hub"]
    with localhub.local_hub(parse_config(data, environ={}).models) as url:
        assert url is None
    assert servers == []


def test_the_hub_serves_inside_the_block_and_stops_when_it_fails(tmp_path, generated) -> None:
    port = free_port()
    cfg = models_config(tmp_path, port)
    with pytest.raises(RuntimeError, match="the stage broke"), localhub.local_hub(cfg) as url:
        assert url == f"http://127.0.0.1:{port}" == cfg.hub_endpoint
        from huggingface_hub import HfApi

        assert HfApi(endpoint=url, token=False).model_info(REPO).sha == resolve(tmp_path / "hub", REPO, "main").sha
        raise RuntimeError("the stage broke")
    assert port_free(port)


def test_a_failed_generation_publishes_nothing_and_frees_the_port(tmp_path, monkeypatch) -> None:
    def broken(folder: Path, kind: str) -> None:
        (folder / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(localhub, "generate_checkpoint", broken)
    port = free_port()
    with pytest.raises(OSError, match="disk full"), localhub.local_hub(models_config(tmp_path, port)):
        pytest.fail("the block must not run")
    assert port_free(port)
    assert not (tmp_path / "hub" / REPO).exists()
    assert [p.name for p in (tmp_path / "hub").iterdir()] == []  # no temporary folder left either


def test_each_generated_repo_is_published_once(tmp_path, generated) -> None:
    other = "k3test/tiny-random"
    cfg = models_config(tmp_path, free_port(), generate={REPO: "scripted", other: "random"})
    assert localhub.publish_generated(cfg.local_hub) == {
        REPO: resolve(tmp_path / "hub", REPO, "main").sha,
        other: resolve(tmp_path / "hub", other, "main").sha,
    }
    assert sorted(kind for _, kind in generated) == ["random", "scripted"]
    assert resolve(tmp_path / "hub", other, "main").message == localhub.generated_by("random")
    assert localhub.publish_generated(cfg.local_hub) == {}
    assert len(generated) == 2


def test_a_checkpoint_made_by_another_generator_version_is_published_anew(tmp_path, generated) -> None:
    cfg = models_config(tmp_path, free_port(), generate={REPO: "scripted"})
    old = publish(tmp_path / "hub", REPO, {"config.json": b"{}"}, "main", "k3deploy generated a scripted checkpoint")
    published = localhub.publish_generated(cfg.local_hub)
    head = resolve(tmp_path / "hub", REPO, "main")
    assert published == {REPO: head.sha} and head.sha != old and head.message == localhub.generated_by("scripted")
    assert generated == [(generated[0][0], "scripted")]
    assert localhub.publish_generated(cfg.local_hub) == {}  # the same generator: not again


def test_the_generator_is_the_local_profiles_write_checkpoint(tmp_path, monkeypatch) -> None:
    """scripted / random become write_checkpoint's `scripted` flag (a stand-in module records the calls)."""
    calls: list[tuple[Path, bool]] = []

    def write_checkpoint(folder: Path, scripted: bool = True, seed: int = 0) -> list[Path]:
        calls.append((folder, scripted))
        (folder / "config.json").write_text("{}")
        return [folder / "config.json"]

    fake = types.ModuleType("k3deploy.localprofile.checkpoint")
    fake.write_checkpoint = write_checkpoint  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "k3deploy.localprofile.checkpoint", fake)
    localhub.generate_checkpoint(tmp_path, "scripted")
    localhub.generate_checkpoint(tmp_path, "random")
    assert calls == [(tmp_path, True), (tmp_path, False)]
