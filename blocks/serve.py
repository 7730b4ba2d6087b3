"""`vllm serve` flags, environment and container settings; defaults are the seed's 4.1 and 5.1."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from k3deploy.blocks._types import AbsPath, Arg, DeviceSpec, EnvName, MountSpec, Name, StrictBlock, Text

SEED_DEVICES = [f"/dev/davinci{i}" for i in range(16)] + [
    "/dev/davinci_manager",
    "/dev/devmm_svm",
    "/dev/hisi_hdc",
]
# The CANN and ATB environments vLLM-Ascend's images expect; their nightly harness sources these before
# `vllm serve` (tests/e2e/nightly/multi_node/scripts/run.sh), while a container command reads no ~/.bashrc.
SEED_SETUP = ["/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnal/atb/set_env.sh"]
SEED_MOUNTS = [
    "/usr/local/dcmi:/usr/local/dcmi",
    "/usr/local/Ascend/driver:/usr/local/Ascend/driver",
    "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi",
    "/etc/ascend_install.info:/etc/ascend_install.info",
]
# Seed 5.1's per-node variables, derived by k3deploy from the rest of the configuration.
DERIVED_ENV = (
    "MODEL_PATH",
    "TOKENIZER_PATH",
    "LOCAL_IP",
    "NODE0_IP",
    "NIC_NAME",
    "SERVICE_PORT",
    "RPC_PORT",
    "DP_SIZE",
    "TP_SIZE",
)
# Seed 5.1, after the per-node variables k3deploy derives itself. ${NAME} refers to one of
# those (MODEL_PATH, TOKENIZER_PATH, LOCAL_IP, NODE0_IP, NIC_NAME, SERVICE_PORT, RPC_PORT,
# DP_SIZE, TP_SIZE); write $$ for a literal dollar sign.
SEED_ENV = {
    "HCCL_IF_IP": "${LOCAL_IP}",
    "GLOO_SOCKET_IFNAME": "${NIC_NAME}",
    "TP_SOCKET_IFNAME": "${NIC_NAME}",
    "HCCL_SOCKET_IFNAME": "${NIC_NAME}",
    "VLLM_ENGINE_READY_TIMEOUT_S": "7200",
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3000",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "HCCL_BUFFSIZE": "1024",
    "HCCL_BUFFSIZE_EP": "2048",
    "HCCL_INTRA_PCIE_ENABLE": "1",
    "HCCL_INTRA_ROCE_ENABLE": "0",
    "HCCL_OP_EXPANSION_MODE": "AIV",
    "OMP_PROC_BIND": "false",
    "OPENBLAS_NUM_THREADS": "1",
    "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(i) for i in range(16)),
}


class ContainerSettings(BaseModel):
    """How each node's container is started (seed 4.1); the model root is always mounted."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(default="vllm-kimi-k3", description="Container name, the same on every node.")
    network: Name = Field(default="host", description="Network mode; vLLM DP needs host networking.")
    shm_size: Text = Field(default="1g", description="--shm-size")
    devices: list[DeviceSpec] = Field(
        default_factory=lambda: list(SEED_DEVICES), description="Host devices passed in (--device)."
    )
    setup_scripts: list[AbsPath] = Field(
        default_factory=lambda: list(SEED_SETUP),
        description="Scripts in the image sourced, in order, before vllm serve (and vllm bench) run in the container.",
    )
    mounts: list[MountSpec] = Field(
        default_factory=lambda: list(SEED_MOUNTS),
        description="Bind mounts host:container[:mode] besides the model root (-v).",
    )


class ProcessSettings(BaseModel):
    """The `process` runtime: vLLM run directly on the node (bare-metal sites, the local profile)."""

    model_config = ConfigDict(extra="forbid")

    state_dir: AbsPath = Field(
        default="/var/tmp/k3deploy/serving",
        description="Per-process folder on each node (pid, exit code, labels, log), one per node's process.",
    )
    stop_timeout_s: float = Field(default=15, gt=0, description="Grace after SIGTERM before SIGKILL on teardown.")


class ReadinessSettings(BaseModel):
    """When launch calls the service ready, and how long it waits (seed: up to 2 h to load and compile)."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(
        default=7500, gt=0, description="Give up on start-up after this long (above VLLM_ENGINE_READY_TIMEOUT_S)."
    )
    poll_s: float = Field(default=5, gt=0, description="Seconds between readiness probes of node 0.")
    request_timeout_s: float = Field(default=120, gt=0, description="Each probe request must answer within this.")
    burst_requests: int | None = Field(
        default=None, ge=1, description="Concurrent requests that must all answer; None means 4 × DP size."
    )


class LivenessSettings(BaseModel):
    """How smoke, bench and accuracy follow the service while they use it (a dead or stuck rank fails them)."""

    model_config = ConfigDict(extra="forbid")

    metrics_poll_s: float = Field(default=5, gt=0, description="Seconds between reads of node 0's /metrics.")
    stall_timeout_s: float = Field(
        default=300,
        gt=0,
        description="A DP rank with requests running but no token processed for this long is stuck: the stage "
        "fails naming it (also when node 0 stops answering /metrics this long).",
    )
    stop_grace_s: float = Field(
        default=30, gt=0, description="After the service is lost, how long the stage's tool has to end once stopped."
    )


class ServeConfig(StrictBlock):
    """The vLLM-Ascend server on every node."""

    _block_type_name = "k3deploy serve"

    served_model_name: Text = Field(default="kimi-k3", description="--served-model-name")
    host: Text = Field(default="0.0.0.0", description="--host the HTTP server binds on node 0 and workers.")
    service_port: int = Field(default=8000, ge=1, le=65535, description="HTTP port on node 0 (--port).")
    rpc_port: int = Field(default=13345, ge=1, le=65535, description="--data-parallel-rpc-port")
    data_parallel_size: int = Field(default=4, ge=1, description="--data-parallel-size (global DP).")
    data_parallel_size_local: int = Field(default=1, ge=1, description="DP ranks per node.")
    tensor_parallel_size: int = Field(default=16, ge=1, description="--tensor-parallel-size")
    enable_expert_parallel: bool = Field(default=True, description="--enable-expert-parallel")
    expert_parallel_size: int | None = Field(
        default=64, ge=1, description="Expected EP group size; must equal DP × TP when EP is on."
    )
    tokenizer_mode: Text | None = Field(default="kimi_k3", description="--tokenizer-mode")
    quantization: Text | None = Field(default="ascend", description="--quantization; None leaves it out.")
    safetensors_load_strategy: Text | None = Field(default="lazy", description="--safetensors-load-strategy")
    enable_prefix_caching: bool = Field(
        default=True,
        description="--enable-prefix-caching; false renders --no-enable-prefix-caching (vLLM's default is on).",
    )
    max_model_len: int = Field(default=133120, ge=1, description="--max-model-len")
    max_num_seqs: int = Field(default=16, ge=1, description="--max-num-seqs")
    max_num_batched_tokens: int = Field(default=8192, ge=1, description="--max-num-batched-tokens")
    gpu_memory_utilization: float = Field(default=0.85, gt=0, le=1, description="--gpu-memory-utilization")
    reasoning_parser: Text | None = Field(default="kimi_k3", description="--reasoning-parser")
    tool_call_parser: Text | None = Field(default="kimi_k3", description="--tool-call-parser")
    enable_auto_tool_choice: bool = Field(default=True, description="--enable-auto-tool-choice")
    compilation_config: dict[str, Any] | None = Field(
        default_factory=lambda: {"cudagraph_mode": "FULL_DECODE_ONLY"},
        description="--compilation-config (JSON); None leaves it out.",
    )
    speculative_config: dict[str, Any] | None = Field(
        default=None,
        description="--speculative-config for a method without a draft checkpoint (vLLM's ngram: {method: ngram, "
        "num_speculative_tokens: 3, prompt_lookup_max: 4}); a DSpark draft is models.draft instead.",
    )
    extra_args: list[Arg] = Field(default_factory=list, description="Further vllm serve flags, as given.")
    env: dict[EnvName, Arg] = Field(
        default_factory=lambda: dict(SEED_ENV),
        description="Environment on every node besides the derived per-node variables; ${NAME} refers to those.",
    )
    runtime: Literal["docker", "process"] = Field(
        default="docker",
        description="docker: a container per node through the Docker API (the seed's way); "
        "process: vLLM run directly on the node from image.environment.",
    )
    container: ContainerSettings = Field(
        default_factory=ContainerSettings, description="Container name, devices, mounts, shm."
    )
    process: ProcessSettings = Field(default_factory=ProcessSettings, description="The process runtime's settings.")
    readiness: ReadinessSettings = Field(
        default_factory=ReadinessSettings, description="When the service counts as ready, how long to wait."
    )
    liveness: LivenessSettings = Field(
        default_factory=LivenessSettings,
        description="How the stages using the service follow it: every rank's exit and log, and token progress.",
    )
