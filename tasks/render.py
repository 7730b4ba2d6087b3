"""The one renderer of launch and bench commands: `k3deploy plan` prints it, launch runs it."""

from __future__ import annotations

import json
import math
import shlex
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from string import Template
from typing import Any, Literal

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.serve import DERIVED_ENV
from k3deploy.tasks.endpoints import service_url

LABEL_PREFIX = "k3deploy"
CONFIG_LABEL = f"{LABEL_PREFIX}.config"  # the fingerprint of the config a container runs
RUN_LABEL = f"{LABEL_PREFIX}.run"
NODE_LABEL = f"{LABEL_PREFIX}.node"
PORTS_LABEL = f"{LABEL_PREFIX}.ports"  # the TCP ports a process listens on, comma-separated: free after its stop


@dataclass(frozen=True)
class ContainerSpec:
    """Everything `docker run` needs; the docker SDK gets the same data."""

    name: str
    image: str
    command: list[str]
    environment: dict[str, str]
    devices: list[str]
    volumes: list[str]
    network: str
    shm_size: str
    labels: dict[str, str] = field(default_factory=dict)

    def docker_run_argv(self) -> list[str]:
        argv = ["docker", "run", "-d", "--name", self.name, f"--net={self.network}", f"--shm-size={self.shm_size}"]
        for device in self.devices:
            argv += ["--device", device]
        for volume in self.volumes:
            argv += ["-v", volume]
        for key, value in self.environment.items():
            argv += ["-e", f"{key}={value}"]
        for key, value in self.labels.items():
            argv += ["--label", f"{key}={value}"]
        return [*argv, self.image, *self.command]


BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ProcessSpec:
    """What the process runtime starts on a node: the same `vllm serve`, from the serving environment.

    The name carries the node's, so nodes sharing a host never share a name, a folder or a log.
    """

    name: str
    state_dir: str  # this process's folder on the node: pid, rc (exit code), labels.json, log
    environment: dict[str, str]
    command: list[str]
    labels: dict[str, str] = field(default_factory=dict)

    def start_script(self) -> str:
        """POSIX sh: start the server in a session of its own, recording its pid, then its exit code."""
        assignments = [f"{key}={value}" for key, value in self.environment.items()]
        inner = shlex.join(["env", *assignments, *self.command]) + " >log 2>&1; echo $? >rc"
        folder = shlex.quote(self.state_dir)
        return "\n".join(
            [
                f"mkdir -p {folder} && cd {folder} && rm -f rc",
                f"printf '%s\\n' {shlex.quote(json.dumps(self.labels, sort_keys=True))} >labels.json",
                f"setsid sh -c {shlex.quote(inner)} </dev/null >/dev/null 2>&1 &",
                "echo $! >pid",
            ]
        )


@dataclass(frozen=True)
class NodePlan:
    """What one node runs: its environment, its `vllm serve` and the container around it."""

    node: str
    address: str
    dp_rank: int
    role: Literal["serve", "headless"]
    env: dict[str, str]
    serve_argv: list[str]
    container: ContainerSpec | None  # serve.runtime docker
    process: ProcessSpec | None = None  # serve.runtime process


@dataclass(frozen=True)
class Plan:
    """The rendered deployment, node 0 first."""

    config_fingerprint: str
    nodes: list[NodePlan]
    bench_argv: list[str]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for node, plan in zip(data["nodes"], self.nodes, strict=True):
            if plan.container is not None:
                node["docker_run_argv"] = plan.container.docker_run_argv()
            if plan.process is not None:
                node["start_script"] = plan.process.start_script()
        return data

    def to_text(self) -> str:
        out = [f"# k3deploy plan (config {self.config_fingerprint}); every line below can be pasted into a shell"]
        for node in self.nodes:
            what = "serves HTTP" if node.role == "serve" else "headless worker"
            out += ["", f"## {node.node} ({node.address}): DP rank {node.dp_rank}, {what}", "", "# environment"]
            out += [f"export {key}={shlex.quote(value)}" for key, value in node.env.items()]
            if node.container is not None:
                out += ["", "# vllm serve (what the container runs)", shell_lines(node.serve_argv)]
                out += ["", "# container", shell_lines(node.container.docker_run_argv())]
            if node.process is not None:
                out += ["", "# vllm serve (what the process runs)", shell_lines(node.serve_argv)]
                out += ["", f"# process (its own session; pid, exit code and log in {node.process.state_dir})"]
                out.append(node.process.start_script())
        out += ["", "## bench (from a load generator in the serving network)", "", shell_lines(self.bench_argv)]
        return "\n".join(out) + "\n"


def shell_lines(argv: list[str]) -> str:
    """shlex.join, one flag per line with backslash continuations, as the tutorial writes commands."""
    lines: list[str] = []
    for token in argv:
        quoted = shlex.quote(token)
        if lines and not token.startswith("-"):
            lines[-1] += f" {quoted}"
        else:
            lines.append(quoted)
    return " \\\n  ".join(lines)


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else repr(value)


def node_env(cfg: DeploymentConfig, index: int) -> dict[str, str]:
    """Seed 5.1's environment for node `index`: derived variables, then serve.env resolved."""
    node, node0 = cfg.cluster.nodes[index], cfg.cluster.nodes[0]
    serve = cfg.serve
    derived = dict(
        zip(
            DERIVED_ENV,
            (
                str(cfg.models.target.path),
                str(cfg.models.tokenizer_path),
                node.serving_ip,
                node0.serving_ip,
                node.nic,
                str(serve.service_port),
                str(serve.rpc_port),
                str(serve.data_parallel_size),
                str(serve.tensor_parallel_size),
            ),
            strict=True,
        )
    )
    env = derived | {key: Template(value).substitute(derived) for key, value in serve.env.items()}
    if index > 0:
        env["DP_START_RANK"] = str(index * serve.data_parallel_size_local)
    return env


def speculative_config(cfg: DeploymentConfig) -> dict[str, Any] | None:
    """Seed 5.2's --speculative-config for a draft, serve.speculative_config without one, else None."""
    draft = cfg.models.draft
    if draft is None:
        return cfg.serve.speculative_config
    return {
        "method": draft.method,
        "model": draft.path,
        "num_speculative_tokens": draft.num_speculative_tokens,
        "draft_tensor_parallel_size": draft.draft_tensor_parallel_size,
        "max_model_len": draft.max_model_len,
        "draft_sample_method": draft.draft_sample_method,
        "enforce_eager": draft.enforce_eager,
    }


def serve_argv(cfg: DeploymentConfig, index: int) -> list[str]:
    """`vllm serve` for node `index` (seed 5.1): node 0 serves, the others are headless."""
    serve, env = cfg.serve, node_env(cfg, index)
    argv = ["vllm", "serve", env["MODEL_PATH"]]
    if index > 0:
        argv.append("--headless")
    argv += ["--host", serve.host, "--port", env["SERVICE_PORT"], "--served-model-name", serve.served_model_name]
    argv += ["--tokenizer", env["TOKENIZER_PATH"]]
    for flag, value in (
        ("--tokenizer-mode", serve.tokenizer_mode),
        ("--quantization", serve.quantization),
        ("--safetensors-load-strategy", serve.safetensors_load_strategy),
    ):
        if value is not None:
            argv += [flag, value]
    argv += ["--tensor-parallel-size", env["TP_SIZE"], "--data-parallel-size", env["DP_SIZE"]]
    argv += ["--data-parallel-size-local", str(serve.data_parallel_size_local)]
    if index > 0:
        argv += ["--data-parallel-start-rank", env["DP_START_RANK"]]
    argv += ["--data-parallel-address", env["NODE0_IP"], "--data-parallel-rpc-port", env["RPC_PORT"]]
    if serve.enable_expert_parallel:
        argv.append("--enable-expert-parallel")
    # vLLM caches prefixes unless told not to: leaving the flag out would not turn it off.
    argv.append("--enable-prefix-caching" if serve.enable_prefix_caching else "--no-enable-prefix-caching")
    argv += [
        "--max-model-len", str(serve.max_model_len),
        "--max-num-seqs", str(serve.max_num_seqs),
        "--max-num-batched-tokens", str(serve.max_num_batched_tokens),
        "--gpu-memory-utilization", _number(serve.gpu_memory_utilization),
    ]  # fmt: skip
    for flag, value in (("--reasoning-parser", serve.reasoning_parser), ("--tool-call-parser", serve.tool_call_parser)):
        if value is not None:
            argv += [flag, value]
    if serve.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    if serve.compilation_config is not None:
        argv += ["--compilation-config", json.dumps(serve.compilation_config)]
    spec = speculative_config(cfg)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    return argv + list(serve.extra_args)


def unit_labels(cfg: DeploymentConfig, index: int, run_id: str | None) -> dict[str, str]:
    """What a node's container or process carries: the config it runs, its node and rank, the run."""
    labels = {
        CONFIG_LABEL: cfg.fingerprint(),
        NODE_LABEL: cfg.cluster.nodes[index].name,
        f"{LABEL_PREFIX}.dp-rank": str(index * cfg.serve.data_parallel_size_local),
    }
    if run_id is not None:
        labels[RUN_LABEL] = run_id
    return labels


def process_spec(cfg: DeploymentConfig, index: int, run_id: str | None = None) -> ProcessSpec:
    """The process runtime's unit for node `index`: its `vllm serve` with the environment's bin first on PATH."""
    name = f"{cfg.serve.container.name}-{cfg.cluster.nodes[index].name}"
    env_path = cfg.image.environment.path
    environment = node_env(cfg, index) | {"VIRTUAL_ENV": env_path, "PATH": f"{env_path}/bin:{BASE_PATH}"}
    ports = listening_ports(cfg, index)
    return ProcessSpec(
        name=name,
        state_dir=f"{cfg.serve.process.state_dir.rstrip('/')}/{name}",
        environment=environment,
        command=serve_argv(cfg, index),
        labels=unit_labels(cfg, index, run_id) | ({PORTS_LABEL: ",".join(map(str, ports))} if ports else {}),
    )


def listening_ports(cfg: DeploymentConfig, index: int) -> list[int]:
    """Node 0 serves the API and binds the DP handshake (`--data-parallel-rpc-port`); headless ranks bind none."""
    return [cfg.serve.service_port, cfg.serve.rpc_port] if index == 0 else []


def sourced(scripts: Sequence[str], command: str) -> str:
    """A shell command run after the image's environment scripts (a failing script stops it)."""
    return " && ".join([*(f". {shlex.quote(s)}" for s in scripts), command])


def entry_argv(scripts: Sequence[str], argv: list[str]) -> list[str]:
    """How a container runs `argv`: the image's environment scripts sourced first, as vLLM-Ascend's harness does."""
    return ["bash", "-c", sourced(scripts, 'exec "$@"'), "k3deploy-entry", *argv] if scripts else list(argv)


def container_spec(cfg: DeploymentConfig, index: int, run_id: str | None = None) -> ContainerSpec:
    """Seed 4.1's container for node `index`, running that node's `vllm serve` directly."""
    settings = cfg.serve.container
    root = cfg.cluster.model_root
    labels = unit_labels(cfg, index, run_id)
    return ContainerSpec(
        name=settings.name,
        image=cfg.image.pinned_ref,
        command=entry_argv(settings.setup_scripts, serve_argv(cfg, index)),
        environment=node_env(cfg, index),
        devices=list(settings.devices),
        volumes=[*settings.mounts, f"{root}:{root}"],
        network=settings.network,
        shm_size=settings.shm_size,
        labels=labels,
    )


def bench_file(workload: str, concurrency: int, repeat: int = 1) -> str:
    """The saved JSON's name for one bench run: one file per workload, concurrency and repeat (a sweep resumes by
    it); the first repeat keeps the name it always had."""
    return f"{workload}-c{concurrency}{'' if repeat == 1 else f'-r{repeat}'}.json"


def bench_seed(workload: str, concurrency: int, repeat: int = 1) -> int:
    """A seed of its own for every run: with vLLM's one default seed every cold run sends the same prompts, and
    all but the first are served from the cache the first one warmed."""
    return zlib.crc32(f"{workload}-c{concurrency}-r{repeat}".encode()) & 0x7FFFFFFF


def bench_result_dir(cfg: DeploymentConfig) -> str:
    """Where node 0 saves this config's results: a folder of its own under bench.result_dir (named by the servers'
    fingerprint, which the plan shows), so two clusters whose node 0 is one machine and working folder (two local
    profiles) never read or remove each other's files; one cluster's runs take turns (the cluster lock)."""
    return f"{cfg.bench.result_dir.rstrip('/')}/{cfg.fingerprint()}"


def bench_argv(
    cfg: DeploymentConfig, workload: str = "random", concurrency: int | None = None, repeat: int = 1
) -> list[str]:
    """Seed section 8's `vllm bench serve` against node 0; `prefix_repetition` is the prefix-hit workload."""
    bench, serve = cfg.bench, cfg.serve
    concurrency = concurrency or bench.max_concurrency
    argv = ["vllm", "bench", "serve", "--backend", bench.backend, "--base-url", service_url(cfg)]
    argv += ["--endpoint", bench.endpoint, "--model", serve.served_model_name]
    argv += ["--tokenizer", str(cfg.models.tokenizer_path)]
    if serve.tokenizer_mode is not None:
        argv += ["--tokenizer-mode", serve.tokenizer_mode]
    if workload == "prefix_repetition":
        prefix = bench.random_input_len * 3 // 4
        argv += [
            "--dataset-name", "prefix_repetition",
            "--prefix-repetition-prefix-len", str(prefix),
            "--prefix-repetition-suffix-len", str(bench.random_input_len - prefix),
            "--prefix-repetition-num-prefixes", str(bench.prefix_repetition_num_prefixes),
            "--prefix-repetition-output-len", str(bench.random_output_len),
        ]  # fmt: skip
    else:
        argv += [
            "--dataset-name", bench.dataset_name,
            "--random-input-len", str(bench.random_input_len),
            "--random-output-len", str(bench.random_output_len),
            "--random-range-ratio", _number(bench.random_range_ratio),
        ]  # fmt: skip
    argv += [
        "--num-prompts", str(bench.num_prompts),
        "--max-concurrency", str(concurrency),
        "--request-rate", _number(bench.request_rate),
    ]  # fmt: skip
    if bench.ignore_eos:
        argv.append("--ignore-eos")
    argv += ["--percentile-metrics", bench.percentile_metrics, "--metric-percentiles", bench.metric_percentiles]
    argv += ["--seed", str(bench_seed(workload, concurrency, repeat)), *bench.slo.goodput_args()]
    name = bench_file(workload, concurrency, repeat)
    # --save-detailed: each request's output length and error, so a short answer or a failure is seen per request
    argv += ["--save-result", "--save-detailed", "--result-dir", bench_result_dir(cfg), "--result-filename", name]
    return argv + list(bench.extra_args)


def render_plan(cfg: DeploymentConfig, run_id: str | None = None) -> Plan:
    """Every node's commands and the bench command, node 0 first."""
    local = cfg.serve.data_parallel_size_local
    nodes = [
        NodePlan(
            node=node.name,
            address=node.address,
            dp_rank=i * local,
            role="serve" if i == 0 else "headless",
            env=node_env(cfg, i),
            serve_argv=serve_argv(cfg, i),
            container=container_spec(cfg, i, run_id) if cfg.serve.runtime == "docker" else None,
            process=process_spec(cfg, i, run_id) if cfg.serve.runtime == "process" else None,
        )
        for i, node in enumerate(cfg.cluster.nodes)
    ]
    return Plan(config_fingerprint=cfg.fingerprint(), nodes=nodes, bench_argv=bench_argv(cfg))
