"""The rendered plan against the tutorial's own commands, flag for flag and value for value."""

from __future__ import annotations

import json
import shlex

import pytest

from k3deploy.blocks import parse_config
from k3deploy.blocks.serve import SEED_SETUP
from k3deploy.tasks.render import entry_argv, render_plan
from tests import seed
from tests.configs import DIGEST, SITE, site_data, with_changes

pytestmark = pytest.mark.config

TEXT = seed.seed_text()
SECTION_5_1 = seed.section(TEXT, "5.1 Four-Node Online Deployment", "Run on Node 0:")
NODE0_CMD, WORKER_CMD = seed.commands(TEXT, "vllm serve ")
(DOCKER_CMD,) = seed.commands(TEXT, "docker run ")
(BENCH_CMD,) = seed.commands(TEXT, "vllm bench serve")
MODEL_ROOT = SITE["<MODEL_ROOT>"]
MODEL_PATH = f"{MODEL_ROOT}/Kimi-K3-w4a8"


def seed_env(node: int) -> dict[str, str]:
    """Section 5.1's variables with the tutorial's placeholders set to this node's site values."""
    env = seed.exports(
        SECTION_5_1.replace("<KIMI_K3_FULL_W4A8_PATH>", MODEL_PATH)
        .replace("<KIMI_K3_TOKENIZER_PATH>", MODEL_PATH)
        .replace("<CURRENT_NODE_IP>", SITE[f"<NODE{node}_IP>"])
        .replace("<NODE0_IP>", SITE["<NODE0_IP>"])
        .replace("<CURRENT_NODE_NIC>", SITE[f"<NODE{node}_NIC>"])
    )
    if node:
        env["DP_START_RANK"] = str(node)
    return env


@pytest.fixture(scope="module")
def plan():
    return render_plan(parse_config(site_data()))


@pytest.mark.parametrize("node", range(4))
def test_environment_is_section_5_1(plan, node):
    assert plan.nodes[node].env == seed_env(node)


@pytest.mark.parametrize("node", range(4))
def test_vllm_serve_matches_seed(plan, node):
    expected = shlex.split(seed.expand(NODE0_CMD if node == 0 else WORKER_CMD, seed_env(node)))
    got = plan.nodes[node].serve_argv
    assert seed.flags(got) == seed.flags(expected)
    assert plan.nodes[node].role == ("serve" if node == 0 else "headless")


@pytest.mark.parametrize("node", range(4))
def test_docker_run_matches_seed(plan, node):
    spec = plan.nodes[node].container
    seed_argv = shlex.split(seed.expand(DOCKER_CMD, {"MODEL_ROOT": MODEL_ROOT, "IMAGE": "IMAGE"}))
    seed_positional, seed_flags = seed.flags(seed_argv[:-2])  # drop "$IMAGE bash"
    positional, ours = seed.flags(spec.docker_run_argv()[: -len(spec.command) - 1])
    assert positional == seed_positional == ["docker", "run"]
    # Launch runs detached and non-interactive: the seed's --rm -it become -d.
    assert seed_flags - ours == {("--rm", None): 1, ("-it", None): 1}
    extra = ours - seed_flags
    assert extra.pop(("-d", None)) == 1
    assert {flag for flag, _ in extra} == {"-e", "--label"}
    assert sorted(v for f, v in extra if f == "-e") == sorted(f"{k}={v}" for k, v in seed_env(node).items())
    # The seed runs `bash` and types `vllm serve` in it, so the image's environment scripts are sourced first.
    assert spec.docker_run_argv()[-len(spec.command) - 1 :] == [
        spec.image,
        *entry_argv(SEED_SETUP, plan.nodes[node].serve_argv),
    ]
    assert spec.image == f"quay.io/ascend/vllm-ascend:nightly-main-a3@{DIGEST}"


@pytest.mark.parametrize(
    ("repo", "tokens"),
    [("RadixArk/Kimi-K3-DSpark", 7), ("Inferact/Kimi-K3-DSpark", 7), ("Inferact/Kimi-K3-DSpark-Block5", 5)],
)
def test_speculative_config_matches_seed(repo, tokens):
    plan = render_plan(parse_config(with_changes(site_data(), models__draft={"repo": repo})))
    expected = seed.speculative_config(TEXT) | {
        "model": f"{MODEL_ROOT}/{repo.split('/')[1]}",
        "num_speculative_tokens": tokens,
    }
    for node in plan.nodes:
        argv = node.serve_argv
        assert argv.count("--speculative-config") == 1
        assert json.loads(argv[argv.index("--speculative-config") + 1]) == expected
        without = argv[: argv.index("--speculative-config")] + argv[argv.index("--speculative-config") + 2 :]
        assert without == render_plan(parse_config(site_data())).nodes[node.dp_rank].serve_argv


def test_bench_matches_seed(plan):
    """The seed's command, plus the percentiles the run record keeps, a file name per workload, a seed of each
    run's own (vLLM's one default seed would send every cold run the same prompts) and a result folder of the
    config's own under the seed's (two clusters whose node 0 is one machine never take each other's files)."""
    from k3deploy.tasks.render import bench_seed

    env = {"NODE0_IP": SITE["<NODE0_IP>"], "TOKENIZER_PATH": MODEL_PATH}
    positional, rendered = seed.flags(plan.bench_argv)
    seed_positional, expected = seed.flags(shlex.split(seed.expand(BENCH_CMD, env)))
    own = f"./benchmark-results/{parse_config(site_data()).fingerprint()}"
    assert positional == seed_positional and rendered - expected == seed.flags(
        ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
         "--result-filename", "random-c4.json", "--seed", str(bench_seed("random", 4)), "--result-dir", own,
         "--save-detailed"]
    )[1]  # fmt: skip
    assert expected - rendered == seed.flags(["--result-dir", "./benchmark-results"])[1]


def test_text_plan_pastes_back_to_the_same_commands(plan):
    # What a person pastes from `k3deploy plan` is exactly what launch runs, node by node.
    sections = plan.to_text().replace("\\\n", " ").split("\n## ")[1:]
    assert len(sections) == len(plan.nodes) + 1
    for node, text in zip(plan.nodes, sections, strict=False):
        assert text.startswith(f"{node.node} ")
        lines = [shlex.split(line) for line in text.splitlines()[1:] if line and not line.startswith("#")]
        exported = dict(argv[1].split("=", 1) for argv in lines if argv[0] == "export")
        assert exported == node.env
        assert node.serve_argv in lines
        assert node.container.docker_run_argv() in lines
    assert plan.bench_argv in [shlex.split(line) for line in sections[-1].splitlines()[1:] if line]


def test_json_plan_carries_the_same_commands(plan):
    data = json.loads(json.dumps(plan.to_json()))
    for node, rendered in zip(data["nodes"], plan.nodes, strict=True):
        assert node["serve_argv"] == rendered.serve_argv
        assert node["docker_run_argv"] == rendered.container.docker_run_argv()
        assert node["env"] == rendered.env
    assert data["bench_argv"] == plan.bench_argv
