"""k3sim: a stand-in for `vllm serve` (vLLM-Ascend) inside the k3deploy test bed's image.

Pure standard library. In the image this file is `vllm/entrypoints/cli/main.py` and the
`vllm` console script calls `main()`; on this machine `python3 vllm_standin.py serve ...`
runs it directly. It accepts the flags of `vllm serve` that the pipeline renders (unknown
flags exit 2, as argparse does), prints vLLM-like start-up lines including the healthy
milestones, and then:

* node 0 (no `--headless`) serves `/health`, `/v1/models`, `/v1/chat/completions`,
  `/v1/completions` (JSON or SSE with `stream: true`), `/version` and `/metrics`;
* a `--headless` rank serves nothing: it joins node 0 over `--data-parallel-address`:
  `--data-parallel-rpc-port` (a JSON-lines TCP handshake), answers the share of requests
  node 0 routes to it, and logs.

Like real vLLM data parallelism, node 0 is ready only once every remote rank has joined and
finished loading; a request routed to a rank that died or hangs never returns, while
`/health` stays 200 (with `--enable-expert-parallel`, every request: each step is an
all-to-all over all ranks); a headless rank that never reaches node 0 gives up after
K3SIM_FRONTEND_TIMEOUT_S (default 300 s), logs `EngineCore failed to start` and exits 0.

Fault controls come from the environment and, when K3SIM_CONTROL_FILE names a JSON object
file, from that file (same keys; its values win), re-read while running. A key suffixed `_DP<r>`
(e.g. K3SIM_STARTUP_S_DP1) applies only to the process whose first DP rank is r and wins over the
plain key. All times are seconds since the process started. See testbed/README.md for the table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import itertools
import json
import os
import signal
import socket
import socketserver
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

T0 = time.monotonic()
DEFAULT_STARTUP_S = 0.5
DEFAULT_FRONTEND_TIMEOUT_S = 300.0
DEFAULT_ENGINE_READY_TIMEOUT_S = 600.0
WAIT_LOG_INTERVAL_S = 10.0
TICK_S = 0.02

TOKENIZER_MODES = ("auto", "slow", "mistral", "custom", "kimi_k3")
REASONING_PARSERS = (
    "deepseek_r1", "deepseek_v3", "glm45", "gpt_oss", "granite", "hunyuan_a13b",
    "kimi_k2", "kimi_k3", "mistral", "qwen3", "seed_oss", "step3",
)  # fmt: skip
TOOL_CALL_PARSERS = (
    "deepseek_v3", "deepseek_v31", "glm45", "granite", "hermes", "hunyuan_a13b", "internlm",
    "jamba", "kimi_k2", "kimi_k3", "llama3_json", "llama4_pythonic", "mistral", "openai",
    "pythonic", "qwen3_coder", "qwen3_xml", "seed_oss", "step3", "xlam",
)  # fmt: skip
QUANTIZATION_METHODS = (
    "ascend", "awq", "awq_marlin", "bitsandbytes", "compressed-tensors", "experts_int8",
    "fp8", "gguf", "gptq", "gptq_marlin", "modelopt", "moe_wna16", "mxfp4", "torchao",
)  # fmt: skip
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
SITE = "/usr/local/lib/python3.11/dist-packages"  # where tracebacks say the code is

REASONING_TEXT = "The user asks a question . I will answer briefly and precisely ."
ANSWER_TEXT = (
    "Prefix caching keeps the key and value cache of prompt prefixes the server has already "
    "processed , so a repeated long prompt skips most of its prefill work and the answer starts sooner ."
)
ROUTES = (
    ("/health", "GET"),
    ("/metrics", "GET"),
    ("/version", "GET"),
    ("/v1/models", "GET"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
)


@functools.cache
def vllm_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - always there on 3.8+
        return "0.0.0+k3sim"
    try:
        return version("vllm")
    except PackageNotFoundError:
        return "0.0.0+k3sim"


# --------------------------------------------------------------------------- logging


class Log:
    """vLLM-style log lines (`INFO 11-30 10:00:00 [file.py:123] msg`), flushed one by one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def write(self, text: str, err: bool = False) -> None:
        stream = sys.stderr if err else sys.stdout
        with self._lock, contextlib.suppress(OSError, ValueError):
            stream.write(text if text.endswith("\n") else text + "\n")
            stream.flush()

    def line(self, level: str, where: str, msg: str, proc: str = "") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        prefix = f"({proc}) " if proc else ""
        self.write(f"{prefix}{level} {stamp} [{where}] {msg}", err=level in ("ERROR", "CRITICAL"))

    def info(self, where: str, msg: str, proc: str = "") -> None:
        self.line("INFO", where, msg, proc)

    def debug(self, where: str, msg: str, proc: str = "") -> None:
        """Printed only with VLLM_LOGGING_LEVEL=DEBUG, as vLLM's logger does."""
        if os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG":
            self.line("DEBUG", where, msg, proc)

    def warning(self, where: str, msg: str, proc: str = "") -> None:
        self.line("WARNING", where, msg, proc)

    def error(self, where: str, msg: str, proc: str = "") -> None:
        self.line("ERROR", where, msg, proc)

    def filler(self, count: int, proc: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        lines = "".join(
            f"({proc}) INFO {stamp} [k3sim.py:{i % 997}] k3sim filler line {i}/{count}: "
            "padding to make log volume, nothing happened\n"
            for i in range(1, count + 1)
        )
        self.write(lines)


LOG = Log()


def die(code: int) -> None:
    """Leave now, from any thread (the process is PID 1 of its container)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


# --------------------------------------------------------------------------- fault controls


class Controls:
    """K3SIM_* settings: environment, overridden by the JSON file named by K3SIM_CONTROL_FILE."""

    def __init__(self, environ: dict[str, str], rank: int = 0) -> None:
        self._env = dict(environ)
        self._rank = rank
        self._path = environ.get("K3SIM_CONTROL_FILE") or None
        self._file: dict[str, str] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._warned = False
        self.refresh()

    def refresh(self) -> None:
        if not self._path:
            return
        try:
            st = os.stat(self._path)
        except OSError:
            self._stamp, self._file = None, {}
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        try:
            data = json.loads(Path(self._path).read_text() or "{}")
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            if not self._warned:
                LOG.warning("k3sim.py:1", f"k3sim: ignoring control file {self._path}: {exc}")
                self._warned = True
            return  # keep the previous values; retried on the next change
        self._stamp, self._warned = stamp, False
        self._file = {str(k): _text(v) for k, v in data.items()}

    def get(self, key: str) -> str | None:
        for name in (f"{key}_DP{self._rank}", key):  # this rank's own setting first
            value = self._file.get(name, self._env.get(name))
            if value is not None and value != "":
                return value
        return None

    def number(self, key: str, default: float | None = None) -> float | None:
        value = self.get(key)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            return default

    def integer(self, key: str, default: int) -> int:
        value = self.number(key)
        return default if value is None else int(value)

    def flag(self, key: str) -> bool:
        return (self.get(key) or "0").lower() not in ("0", "false", "no", "off")


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def elapsed() -> float:
    return time.monotonic() - T0


def watch(controls: Controls, proc: str) -> None:
    """Apply K3SIM_DIE_AFTER_S, K3SIM_FATAL_LINE and K3SIM_LOG_LINES as they come due."""
    printed: set[str] = set()
    last_lines: str | None = None
    while True:
        controls.refresh()
        now = elapsed()
        die_after = controls.number("K3SIM_DIE_AFTER_S")
        if die_after is not None and now >= die_after:
            die(controls.integer("K3SIM_DIE_EXIT_CODE", 1))
        line = controls.get("K3SIM_FATAL_LINE")
        if line is not None and line not in printed and now >= (controls.number("K3SIM_FATAL_AFTER_S", 0.0) or 0.0):
            printed.add(line)
            LOG.write(line, err=True)
            if not controls.flag("K3SIM_FATAL_KEEP_RUNNING"):
                die(controls.integer("K3SIM_FATAL_EXIT_CODE", 1))
        lines = controls.get("K3SIM_LOG_LINES")
        if lines != last_lines:
            last_lines = lines
            with contextlib.suppress(ValueError):
                if lines is not None and int(lines) > 0:
                    LOG.filler(int(lines), proc)
        time.sleep(TICK_S)


def hold_while_hanging(controls: Controls) -> None:
    """K3SIM_HANG: requests stop being answered (until the control is cleared)."""
    while controls.flag("K3SIM_HANG"):
        time.sleep(TICK_S * 2)


LEAKED: list[bytes] = []  # what K3SIM_LEAK_MB_PER_REQUEST keeps: never freed while the process lives


def leak(controls: Controls) -> None:
    """K3SIM_LEAK_MB_PER_REQUEST: each request a rank answers keeps that many MiB, written (so resident), for good."""
    mib = controls.number("K3SIM_LEAK_MB_PER_REQUEST", 0.0) or 0.0
    if mib > 0:
        LEAKED.append(b"\x01" * int(mib * 1024 * 1024))


def pace(controls: Controls, tokens: int) -> None:
    """Hold while K3SIM_HANG is set, then take K3SIM_TOKEN_S per token."""
    hold_while_hanging(controls)
    delay = (controls.number("K3SIM_TOKEN_S", 0.0) or 0.0) * tokens
    if delay > 0:
        time.sleep(delay)


# --------------------------------------------------------------------------- arguments


def _json_arg(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {value!r}: {exc}") from None


def _compilation_arg(value: str) -> Any:
    return int(value) if value.isdigit() else _json_arg(value)


class _Parser(argparse.ArgumentParser):
    """argparse that accepts `--max_model_len` for `--max-model-len`, like vLLM's FlexibleArgumentParser."""

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        fixed = []
        for token in argv:
            if token.startswith("--") and len(token) > 2:
                key, eq, value = token.partition("=")
                token = key.replace("_", "-") + eq + value
            fixed.append(token)
        return super().parse_args(fixed, namespace)


def build_parser() -> argparse.ArgumentParser:
    top = _Parser(prog="vllm", description="vLLM CLI", allow_abbrev=False)
    top.add_argument("-v", "--version", action="version", version=vllm_version())
    sub = top.add_subparsers(dest="subparser", metavar="{serve}")
    serve = sub.add_parser(
        "serve",
        help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
        description="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP "
        "(k3deploy test-bed stand-in for vLLM-Ascend: it loads no model).",
        usage="vllm serve [model_tag] [options]",
        allow_abbrev=False,
    )
    s = serve.add_argument
    s("model_tag", nargs="?", help="The model tag to serve (optional if specified in config)")
    s("--model", help="Name or path of the Hugging Face model to use.")
    s("--headless", action="store_true", help="Run in headless mode (no API server).")
    s("--host", help="Host name.")
    s("--port", type=int, default=8000, help="Port number.")
    s("--api-server-count", "-asc", type=int, default=1, help="How many API server processes to run.")
    s("--served-model-name", nargs="+", help="The model name(s) used in the API.")
    s("--tokenizer", help="Name or path of the Hugging Face tokenizer to use.")
    s("--tokenizer-mode", choices=TOKENIZER_MODES, default="auto", help="Tokenizer mode.")
    s("--trust-remote-code", action="store_true", help="Trust remote code from Hugging Face.")
    s("--revision", help="The specific model version to use.")
    s("--dtype", default="auto", help="Data type for model weights and activations.")
    s("-q", "--quantization", help="Method used to quantize the weights (e.g. ascend).")
    s("--safetensors-load-strategy", default="lazy", help="Safetensors loading strategy (lazy, eager, ...).")
    s("--load-format", default="auto", help="The format of the model weights to load.")
    s("--max-model-len", type=int, help="Model context length (prompt and output).")
    s("--max-num-seqs", type=int, default=256, help="Maximum number of sequences per iteration.")
    s("--max-num-batched-tokens", type=int, help="Maximum number of tokens per iteration.")
    s("--gpu-memory-utilization", type=float, default=0.9, help="Fraction of device memory for the executor.")
    s("--kv-cache-dtype", default="auto", help="Data type for KV cache storage.")
    s("--block-size", type=int, help="Token block size for contiguous chunks of tokens.")
    s("--swap-space", type=float, default=4, help="CPU swap space size (GiB) per device.")
    s("--seed", type=int, help="Random seed.")
    s("--enforce-eager", action="store_true", help="Always use eager-mode execution.")
    s("--enable-prefix-caching", action=argparse.BooleanOptionalAction, help="Enable prefix caching.")
    s("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, help="Enable chunked prefill.")
    s("--async-scheduling", action=argparse.BooleanOptionalAction, help="Enable async scheduling.")
    s("--tensor-parallel-size", "-tp", type=int, default=1, help="Number of tensor parallel groups.")
    s("--pipeline-parallel-size", "-pp", type=int, default=1, help="Number of pipeline parallel groups.")
    s("--data-parallel-size", "-dp", type=int, default=1, help="Number of data parallel groups.")
    s("--data-parallel-size-local", "-dpl", type=int, help="Number of data parallel replicas on this node.")
    s("--data-parallel-start-rank", "-dpr", type=int, help="Starting data parallel rank for secondary nodes.")
    s("--data-parallel-address", "-dpa", help="Address of data parallel cluster head-node.")
    s("--data-parallel-rpc-port", "-dpp", type=int, default=29550, help="Port for data parallel RPC communication.")
    s("--data-parallel-backend", "-dpb", choices=("mp", "ray"), default="mp", help="Backend for data parallel.")
    s("--data-parallel-hybrid-lb", "-dph", action="store_true", help="Use hybrid DP load balancing.")
    s("--data-parallel-external-lb", "-dpe", action="store_true", help="Use external DP load balancing.")
    s("--enable-expert-parallel", "-ep", action=argparse.BooleanOptionalAction, help="Use expert parallelism.")
    s("--enable-eplb", action=argparse.BooleanOptionalAction, help="Enable expert parallelism load balancing.")
    s("--distributed-executor-backend", help="Backend to use for distributed model workers.")
    s("--disable-custom-all-reduce", action="store_true", help="Disable the custom all-reduce kernel.")
    s("--reasoning-parser", choices=REASONING_PARSERS, help="Reasoning parser for the model.")
    s("--tool-call-parser", choices=TOOL_CALL_PARSERS, help="Tool call parser for --enable-auto-tool-choice.")
    s("--enable-auto-tool-choice", action="store_true", help="Enable auto tool choice for supported models.")
    s("--chat-template", help="The file path to the chat template, or the template in single-line form.")
    s("-O", "--compilation-config", type=_compilation_arg, help="torch.compile / graph configuration (JSON).")
    s("--speculative-config", type=_json_arg, help="The configurations for speculative decoding (JSON).")
    s("--additional-config", type=_json_arg, help="Additional config for the platform plugin (JSON).")
    s("--hf-overrides", type=_json_arg, help="Extra arguments for the Hugging Face config (JSON).")
    s("--limit-mm-per-prompt", type=_json_arg, help="Maximum multimodal inputs per prompt (JSON).")
    s("--mm-processor-kwargs", type=_json_arg, help="Arguments for the multimodal processor (JSON).")
    s("--max-logprobs", type=int, default=20, help="Max number of log probs to return.")
    s("--disable-log-stats", action="store_true", help="Disable logging statistics.")
    s("--enable-log-requests", action=argparse.BooleanOptionalAction, help="Log requests.")
    s("--disable-log-requests", action="store_true", help="Disable logging requests (deprecated).")
    s("--disable-uvicorn-access-log", action="store_true", help="Disable uvicorn access log.")
    s("--uvicorn-log-level", default="info", help="Log level for uvicorn.")
    s("--api-key", help="If provided, the server will require this key in the Authorization header.")
    s("--root-path", help="FastAPI root_path when app is behind a path based routing proxy.")
    return top


def parse(argv: list[str]) -> argparse.Namespace:
    # vLLM's `--help=all|<group>|<keyword>` narrows its help; the stand-in always prints all of it.
    argv = ["--help" if a.startswith("--help=") else a for a in argv]
    args = build_parser().parse_args(argv)
    if args.subparser is None:
        build_parser().print_help()
        sys.exit(0)
    args.model = args.model_tag or args.model or DEFAULT_MODEL
    args.served_model_name = args.served_model_name or [args.model]
    if args.data_parallel_size_local is None:
        args.data_parallel_size_local = 1 if args.headless else args.data_parallel_size
    if args.data_parallel_start_rank is None:
        args.data_parallel_start_rank = 0
    args.data_parallel_address = args.data_parallel_address or "127.0.0.1"
    return args


# --------------------------------------------------------------------------- start-up checks


def fail(proc: str, lines: list[str], code: int = 1) -> None:
    """A start-up error the way vLLM prints one: a traceback ending in the error line."""
    LOG.write("\n".join([f"({proc}) Traceback (most recent call last):", *[f"({proc}) {x}" for x in lines]]), err=True)
    die(code)


def model_max_len(model: str) -> int | None:
    config = Path(model, "config.json")
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "max_sequence_length", "seq_length"):
        if isinstance(data.get(key), int):
            return int(data[key])
        text = data.get("text_config")
        if isinstance(text, dict) and isinstance(text.get(key), int):
            return int(text[key])
    return None


def architecture(model: str) -> str:
    with contextlib.suppress(OSError, ValueError, TypeError, IndexError):
        return str(json.loads(Path(model, "config.json").read_text())["architectures"][0])
    return "KimiK3ForConditionalGeneration"


def check_config(args: argparse.Namespace, controls: Controls, proc: str) -> int:
    """The configuration errors real vLLM reports 2-3 s into start-up; returns max_model_len."""
    if args.quantization is not None and args.quantization not in QUANTIZATION_METHODS:
        fail(
            proc,
            [
                f'  File "{SITE}/vllm/engine/arg_utils.py", line 1327, in create_engine_config',
                "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
                f"  Value error, Unknown quantization method: {args.quantization}. Must be one of "
                f"{list(QUANTIZATION_METHODS)}. [type=value_error, input_value=ArgsKwargs(()), input_type=ArgsKwargs]",
            ],
        )
    if controls.get("K3SIM_CHECK_MODEL") != "0" and not Path(args.model).is_dir():
        where = f'  File "{SITE}/huggingface_hub/utils/_validators.py", line 154, in validate_repo_id'
        if args.model.startswith(("/", ".")) or args.model.count("/") > 1:
            err = (
                "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
                f"'namespace/repo_name': '{args.model}'. Use `repo_type` argument if needed."
            )
        else:
            err = (
                "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot "
                "folder for the specified revision on the local disk and outgoing traffic has been disabled: "
                f"{args.model}"
            )
        fail(proc, [where, err])
    derived = model_max_len(args.model)
    if args.max_model_len is not None and derived is not None and args.max_model_len > derived:
        fail(
            proc,
            [
                f'  File "{SITE}/vllm/config/model.py", line 2134, in _get_and_verify_max_len',
                f"ValueError: User-specified max_model_len ({args.max_model_len}) is greater than the derived "
                f"max_model_len (max_position_embeddings={derived} or model_max_length=None in model's config.json). "
                "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
            ],
        )
    return args.max_model_len or derived or 4096


# --------------------------------------------------------------------------- engine start-up


def engine_startup(
    args: argparse.Namespace, controls: Controls, rank: int, world: int, max_len: int, since: float
) -> None:
    """One DP rank's engine log, paced by K3SIM_STARTUP_S (re-read while waiting)."""
    proc = f"EngineCore_DP{rank} pid={LOG.pid + 40 + rank}"

    def until(fraction: float) -> None:
        while elapsed() - since < fraction * (controls.number("K3SIM_STARTUP_S", DEFAULT_STARTUP_S) or 0.0):
            time.sleep(TICK_S)

    spec = args.speculative_config
    LOG.info(
        "core.py:77",
        f"Initializing a V1 LLM engine (v{vllm_version()}) with config: model='{args.model}', "
        f"speculative_config={spec}, tokenizer='{args.tokenizer or args.model}', "
        f"tokenizer_mode={args.tokenizer_mode}, dtype=torch.bfloat16, max_seq_len={max_len}, "
        f"tensor_parallel_size={args.tensor_parallel_size}, data_parallel_size={args.data_parallel_size}, "
        f"quantization={args.quantization}, enforce_eager={args.enforce_eager}, device_config=npu, "
        f"served_model_name={args.served_model_name[0]}, enable_prefix_caching={bool(args.enable_prefix_caching)}, "
        f"compilation_config={json.dumps(args.compilation_config)}",
        proc,
    )
    tp = args.tensor_parallel_size
    LOG.info(
        "parallel_state.py:1208",
        f"rank {rank * tp} in world size {world * tp} is assigned as DP rank {rank}, PP rank 0, TP rank 0, "
        f"EP rank {rank * tp}",
        proc,
    )
    LOG.info("model_runner_v1.py:2605", f"Starting to load model {args.model}...", proc)
    until(0.4)
    took = elapsed() - since
    LOG.info("default_loader.py:267", f"Loading weights took {took:.2f} seconds", proc)
    LOG.info("model_runner_v1.py:2640", f"Loading model weights took 35.2134 GB, {took:.6f} seconds", proc)
    until(0.6)
    kv_tokens = int(max_len * max(1, args.max_num_seqs) * 0.58)
    LOG.info("worker_v1.py:255", "Available memory: 15418257817, total memory: 65452113920", proc)
    LOG.info("kv_cache_utils.py:1087", f"GPU KV cache size: {kv_tokens:,} tokens", proc)
    LOG.info(
        "kv_cache_utils.py:1091",
        f"Maximum concurrency for {max_len:,} tokens per request: {kv_tokens / max_len:.2f}x",
        proc,
    )
    until(0.9)
    mode = (args.compilation_config or {}).get("cudagraph_mode") if isinstance(args.compilation_config, dict) else None
    if not args.enforce_eager and mode != "NONE":
        LOG.info(
            "model_runner_v1.py:3302",
            f"Graph capturing finished in {max(1, round(elapsed() - since))} secs, took 1.23 GiB",
            proc,
        )
    until(1.0)
    LOG.info(
        "core.py:210",
        f"init engine (profile, create kv cache, warmup model) took {elapsed() - since:.2f} seconds",
        proc,
    )


# --------------------------------------------------------------------------- data parallel links


def send_json(sock: socket.socket, lock: threading.Lock, msg: dict[str, Any]) -> bool:
    try:
        with lock:
            sock.sendall((json.dumps(msg) + "\n").encode())
        return True
    except OSError:
        return False


class RemoteRank:
    """Node 0's view of one joined headless process (it may hold several DP ranks)."""

    def __init__(self, sock: socket.socket, ranks: list[int]) -> None:
        self.sock, self.ranks = sock, ranks
        self.lock = threading.Lock()
        self.ready = False
        self.alive = True


class Coordinator:
    """Node 0's side of the DP handshake and request routing."""

    def __init__(self, args: argparse.Namespace, controls: Controls) -> None:
        self.args, self.controls = args, controls
        local = args.data_parallel_size_local
        self.local_ranks = list(range(local))
        self.remote_expected = set(range(local, args.data_parallel_size))
        self.remotes: dict[int, RemoteRank] = {}
        self.pending: dict[int, threading.Event] = {}
        self.ids = itertools.count(1)
        self.rr = itertools.count()
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None

    def bind(self) -> None:
        if not self.remote_expected:
            return
        addr = (self.args.data_parallel_address, self.args.data_parallel_rpc_port)
        sock = socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            where = f'  File "{SITE}/zmq/sugar/socket.py", line 311, in bind'
            detail = "Address already in use" if exc.errno == 98 else (exc.strerror or str(exc))
            fail(
                f"APIServer pid={LOG.pid}", [where, f"zmq.error.ZMQError: {detail} (addr='tcp://{addr[0]}:{addr[1]}')"]
            )
        sock.listen(64)
        self.listener = sock
        threading.Thread(target=self._accept, daemon=True, name="dp-accept").start()

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_peer, args=(conn,), daemon=True).start()

    def _serve_peer(self, conn: socket.socket) -> None:
        peer: RemoteRank | None = None
        try:
            for raw in conn.makefile("rb"):
                msg = json.loads(raw)
                if msg.get("op") == "hello":
                    ranks = [int(r) for r in msg.get("ranks", []) if int(r) in self.remote_expected]
                    peer = RemoteRank(conn, ranks)
                    with self.lock:
                        for r in ranks:
                            self.remotes.setdefault(r, peer)
                    send_json(conn, peer.lock, {"op": "welcome", "config": {"max_model_len": self.args.max_model_len}})
                elif msg.get("op") == "ready" and peer is not None:
                    peer.ready = True
                elif msg.get("op") == "result":
                    with self.lock:
                        event = self.pending.pop(int(msg.get("id", 0)), None)
                    if event is not None:
                        event.set()
        except (OSError, ValueError):
            pass
        if peer is not None:
            peer.alive = False  # silently: its share of requests now hangs, /health stays 200

    def remote_waiting(self) -> int:
        """Remote DP ranks that have not joined or not finished loading."""
        with self.lock:
            joined = {r for r, p in self.remotes.items() if p.ready}
        return len(self.remote_expected - joined)

    def route(self) -> int:
        return next(self.rr) % self.args.data_parallel_size

    def run_on(self, rank: int, tokens: int) -> None:
        """Block until `rank` has produced the request's tokens; forever if it is gone or hangs.

        With expert parallelism every forward step is an all-to-all over all ranks: one dead rank stalls
        every request, not only the share routed to it.
        """
        if self.args.enable_expert_parallel:
            with self.lock:
                dead = any(not peer.alive for peer in self.remotes.values())
            if dead:
                threading.Event().wait()
        if rank in self.local_ranks:
            leak(self.controls)
            pace(self.controls, tokens)
            return
        hold_while_hanging(self.controls)
        with self.lock:
            peer = self.remotes.get(rank)
            rid = next(self.ids)
            event = self.pending[rid] = threading.Event()
        if (
            peer is None
            or not peer.alive
            or not send_json(peer.sock, peer.lock, {"op": "run", "id": rid, "rank": rank, "tokens": tokens})
        ):
            threading.Event().wait()  # like a request routed to a dead DP peer: never answered
        event.wait()


def headless(args: argparse.Namespace, controls: Controls, max_len: int) -> None:
    """A --headless rank: join node 0, load, then answer what it routes here."""
    ranks = list(range(args.data_parallel_start_rank, args.data_parallel_start_rank + args.data_parallel_size_local))
    head = f"tcp://{args.data_parallel_address}:{args.data_parallel_rpc_port}"
    LOG.info(
        "serve.py:183",
        f"Launching {len(ranks)} data parallel engine(s) in headless mode, with head node address {head}.",
    )
    proc = f"EngineCore_DP{ranks[0]} pid={LOG.pid + 40 + ranks[0]}"
    LOG.info("core.py:644", "Waiting for init message from front-end.", proc)
    timeout = controls.number("K3SIM_FRONTEND_TIMEOUT_S", DEFAULT_FRONTEND_TIMEOUT_S) or 0.0
    sock = None
    while sock is None:
        try:
            sock = socket.create_connection((args.data_parallel_address, args.data_parallel_rpc_port), timeout=1)
        except OSError:
            if elapsed() >= timeout:
                minutes = timeout / 60
                text = f"{minutes:g} minutes" if minutes >= 1 else f"{timeout:g} seconds"
                LOG.error("core.py:708", "EngineCore failed to start.", proc)
                LOG.write(
                    f"({proc}) Traceback (most recent call last):\n"
                    f'({proc})   File "{SITE}/vllm/v1/engine/core.py", line 699, '
                    "in run_engine_core\n"
                    f"({proc}) RuntimeError: Did not receive response from front-end process within {text}",
                    err=True,
                )
                die(0)  # real vLLM's headless rank leaves with rc 0 here
            time.sleep(0.2)
    sock.settimeout(None)
    lock = threading.Lock()
    send_json(sock, lock, {"op": "hello", "ranks": ranks, "node": socket.gethostname()})
    reader = sock.makefile("rb")
    since = elapsed()
    for rank in ranks:
        engine_startup(args, controls, rank, args.data_parallel_size, max_len, since)
    send_json(sock, lock, {"op": "ready", "ranks": ranks})

    def answer(msg: dict[str, Any]) -> None:
        leak(controls)
        pace(controls, int(msg.get("tokens", 0)))
        send_json(sock, lock, {"op": "result", "id": msg.get("id")})

    try:
        for raw in reader:
            msg = json.loads(raw)
            if msg.get("op") == "run":
                threading.Thread(target=answer, args=(msg,), daemon=True).start()
    except (OSError, ValueError):
        pass
    # Node 0 went away: like real vLLM, say nothing and stay alive.
    threading.Event().wait()


# --------------------------------------------------------------------------- generation


def words(text: str) -> list[str]:
    return text.split()


def count_prompt_tokens(messages: Any) -> int:
    total = 0
    for msg in messages if isinstance(messages, list) else []:
        total += 4
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            total += len(content.split())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") == "text":
                    total += len(str(part.get("text", "")).split())
                elif isinstance(part, dict):
                    total += 64  # an image or audio part
    return max(total, 1)


def prompt_blocks(payload: Any) -> list[str]:
    """Hashes of the prompt's 16-word prefix blocks (for prefix-cache hits in /metrics)."""
    text = json.dumps(payload, sort_keys=True)
    toks = text.split()
    out, h = [], hashlib.sha256()
    for i in range(0, len(toks) - len(toks) % 16, 16):
        h.update(" ".join(toks[i : i + 16]).encode())
        out.append(h.hexdigest())
    return out


def tool_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    params = (tool.get("function") or {}).get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required") or list(props)
    args: dict[str, Any] = {}
    for name in required:
        spec = props.get(name) or {}
        if spec.get("enum"):
            args[name] = spec["enum"][0]
        elif spec.get("type") in ("integer", "number"):
            args[name] = 1
        elif spec.get("type") == "boolean":
            args[name] = True
        elif any(k in name.lower() for k in ("city", "location", "place")):
            args[name] = "Paris"
        else:
            args[name] = "k3sim"
    return args


ENGINE_DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


class Answer:
    """What the 'model' says to one request: reasoning, content and/or one tool call."""

    def __init__(self, server: Server, body: dict[str, Any], chat: bool) -> None:
        args = server.args
        if not isinstance(body, dict):
            raise ApiError(400, "Request body must be a JSON object")
        model = body.get("model")
        if model is not None and model not in args.served_model_name:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        self.model = model or args.served_model_name[0]
        self.chat = chat
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ApiError(400, "1 validation error: messages: Field required", param="messages")
            self.prompt_tokens = count_prompt_tokens(messages)
        else:
            prompt = body.get("prompt")
            if prompt is None:
                raise ApiError(400, "1 validation error: prompt: Field required", param="prompt")
            self.prompt_tokens = max(1, len(json.dumps(prompt).split()))
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ApiError(400, f"max_tokens must be at least 1, got {limit}.", param="max_tokens")
        if self.prompt_tokens + (limit or 0) > server.max_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {server.max_len} tokens. However, you requested "
                f"{self.prompt_tokens + (limit or 0)} tokens ({self.prompt_tokens} in the messages, "
                f"{limit or 0} in the completion). Please reduce the length of the messages or completion.",
            )
        self.stream = bool(body.get("stream"))
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        ignore_eos = bool(body.get("ignore_eos"))
        budget = limit if limit is not None else server.max_len - self.prompt_tokens
        self.tool_call: dict[str, Any] | None = None
        reasoning: list[str] = []
        if chat:
            kwargs = body.get("chat_template_kwargs") or {}
            thinking = kwargs.get("thinking", kwargs.get("enable_thinking", True)) is not False
            if args.reasoning_parser and thinking:
                reasoning = words(REASONING_TEXT)
            self.tool_call = self._tool_call(args, body, server.controls.flag("K3SIM_NO_TOOL_PARSER"))
        answer = [] if self.tool_call else words(ANSWER_TEXT)
        if ignore_eos:
            answer = list(
                itertools.islice(itertools.cycle(answer or words(ANSWER_TEXT)), max(0, budget - len(reasoning)))
            )
        script = [("reasoning", w) for w in reasoning] + [("content", w) for w in answer]
        self.finish = "tool_calls" if self.tool_call else "stop"
        if len(script) > budget or (ignore_eos and len(script) >= budget):
            script, self.finish = script[:budget], "length"
            if self.tool_call and len(reasoning) >= budget:
                self.tool_call = None
        self.script = script
        self.completion_tokens = len(script) + (8 if self.tool_call else 0)
        self.blocks = prompt_blocks(body.get("messages") if chat else body.get("prompt"))

    @staticmethod
    def _tool_call(args: argparse.Namespace, body: dict[str, Any], no_parser: bool = False) -> dict[str, Any] | None:
        """`no_parser` (K3SIM_NO_TOOL_PARSER): as a vLLM whose build lacks the parser the flags name."""
        tools = body.get("tools") or []
        choice = body.get("tool_choice", "auto" if tools else "none")
        if not tools or choice == "none":
            return None
        if choice == "auto" and (no_parser or not (args.enable_auto_tool_choice and args.tool_call_parser)):
            need = "--enable-auto-tool-choice and --tool-call-parser"
            raise ApiError(400, f'"auto" tool choice requires {need} to be set')
        messages = body.get("messages") or []
        if choice == "auto" and messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
            return None  # the follow-up turn with the tool's result: answer in text
        tool = tools[0]
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            tool = next((t for t in tools if (t.get("function") or {}).get("name") == name), None)
            if tool is None:
                raise ApiError(400, f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")
        fn = tool.get("function") or {}
        return {
            "id": f"chatcmpl-tool-{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": fn.get("name", "tool"), "arguments": json.dumps(tool_arguments(tool))},
        }

    def text(self, channel: str) -> str | None:
        parts = [w for c, w in self.script if c == channel]
        return " ".join(parts) if parts else None

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
        }


class Stats:
    """Counters behind /metrics, per DP engine."""

    def __init__(self, engines: int, speculative: dict[str, Any] | None, prefix_caching: bool = True) -> None:
        self.lock = threading.Lock()
        self.engines = engines
        self.k = int((speculative or {}).get("num_speculative_tokens") or 0)
        blocks, size = 2048, 128  # what a rank of the stand-in "has room for"; a real engine sizes it from memory
        tokens = blocks * size
        self.cache_labels = {"block_size": str(size), "num_gpu_blocks": str(blocks),
                             "kv_cache_size_tokens": str(tokens),
                             "kv_cache_memory_bytes": str(tokens * 4096), "cache_dtype": "auto",
                             "enable_prefix_caching": str(prefix_caching)}  # fmt: skip
        zero = dict.fromkeys(range(engines), 0)
        self.running = dict(zero)
        self.success: dict[tuple[int, str], int] = {}
        self.prompt, self.generation = dict(zero), dict(zero)
        self.queries, self.hits = dict(zero), dict(zero)
        self.drafts, self.draft_tokens, self.accepted = dict(zero), dict(zero), dict(zero)
        self.seen: set[str] = set()

    def start(self, engine: int, answer: Answer) -> int:
        """Count the request in; the prompt tokens it found in the prefix cache."""
        with self.lock:
            self.running[engine] += 1
            hit = 0
            for block in answer.blocks:
                if block not in self.seen:
                    break
                hit += 16
            self.seen.update(answer.blocks)
            self.queries[engine] += answer.prompt_tokens
            self.hits[engine] += min(hit, answer.prompt_tokens)
            return min(hit, answer.prompt_tokens)

    def reset_prefix_cache(self) -> bool:
        """vLLM refuses (success false) while running requests hold blocks."""
        with self.lock:
            if any(self.running.values()):
                return False
            self.seen.clear()
            return True

    def finish(self, engine: int, answer: Answer) -> None:
        with self.lock:
            self.running[engine] -= 1
            key = (engine, answer.finish if answer.finish != "tool_calls" else "stop")
            self.success[key] = self.success.get(key, 0) + 1
            self.prompt[engine] += answer.prompt_tokens
            self.generation[engine] += answer.completion_tokens
            if self.k:
                drafts = -(-answer.completion_tokens // (self.k + 1))
                self.drafts[engine] += drafts
                self.draft_tokens[engine] += drafts * self.k
                self.accepted[engine] += (drafts * self.k * 7) // 10

    def render(self, model: str) -> str:
        out: list[str] = []

        def family(name: str, kind: str, doc: str, values: dict[Any, int], extra: str = "") -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} {kind}")
            for key, value in sorted(values.items()):
                engine, reason = key if isinstance(key, tuple) else (key, None)
                labels = f'engine="{engine}"'
                if reason is not None:
                    labels += f',finished_reason="{reason}"'
                out.append(f'{name}{{{labels},model_name="{model}"{extra}}} {float(value)}')

        with self.lock:
            family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", self.running)
            family(
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                dict.fromkeys(self.running, 0),
            )
            family(
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                dict.fromkeys(self.running, 0),
            )
            # One sample per engine, labels sorted, as vLLM 0.32.0 writes it (tests/data/launch/vllm-0.32.0/engine/);
            # a subset of its labels: the KV-cache sizing the engine did at start.
            out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
            out.append("# TYPE vllm:cache_config_info gauge")
            for engine in sorted(self.running):
                labels = {**self.cache_labels, "engine": str(engine)}
                out.append("vllm:cache_config_info{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                           + "} 1.0")  # fmt: skip
            family(
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                self.queries,
            )
            family(
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                self.hits,
            )
            family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", self.prompt)
            family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", self.generation)
            family("vllm:request_success_total", "counter", "Count of successfully processed requests.", self.success)
            if self.k:
                family("vllm:spec_decode_num_drafts_total", "counter", "Number of spec decoding drafts.", self.drafts)
                family(
                    "vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.", self.draft_tokens
                )
                family(
                    "vllm:spec_decode_num_accepted_tokens_total", "counter", "Number of accepted tokens.", self.accepted
                )
        return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- HTTP (node 0)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 2048  # uvicorn's backlog: socketserver's default 5 reset a readiness burst under load

    def __init__(self, args: argparse.Namespace, controls: Controls, coordinator: Coordinator, max_len: int) -> None:
        self.args, self.controls, self.coordinator, self.max_len = args, controls, coordinator, max_len
        self.stats = Stats(args.data_parallel_size, args.speculative_config, args.enable_prefix_caching is not False)
        self.fail_every = (0, itertools.count(1))  # K3SIM_FAIL_EVERY and requests counted since it was set
        self.created = int(time.time())
        host = args.host if args.host not in (None, "") else "0.0.0.0"
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, args.port), Handler, bind_and_activate=False)

    def server_bind(self) -> None:
        # Not HTTPServer.server_bind: its getfqdn() waits on DNS, which a bed host lacks.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if self.server.args.disable_uvicorn_access_log:
            return
        try:
            phrase = HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        host, port = self.client_address[:2]
        LOG.write(f'(APIServer pid={LOG.pid}) INFO:     {host}:{port} - "{self.requestline}" {code} {phrase}')

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Any) -> None:
        self._send(status, json.dumps(data).encode())

    def _authorized(self, path: str) -> bool:
        """--api-key guards /v1/* as in vLLM: `Authorization: Bearer <key>` or 401."""
        key = self.server.args.api_key
        if not key or not path.startswith("/v1") or self.headers.get("authorization") == f"Bearer {key}":
            return True
        self._json(401, {"error": "Unauthorized"})
        return False

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        args = self.server.args
        if not self._authorized(path):
            return
        if path in ("/health", "/ping"):
            self._send(200, b"")
        elif path == "/version":
            self._json(200, {"version": vllm_version()})
        elif path == "/v1/models":
            data = [
                {
                    "id": name,
                    "object": "model",
                    "created": self.server.created,
                    "owned_by": "vllm",
                    "root": args.model,
                    "parent": None,
                    "max_model_len": self.server.max_len,
                    "permission": [],
                }
                for name in args.served_model_name
            ]
            self._json(200, {"object": "list", "data": data})
        elif path == "/metrics":
            self._send(200, self.server.stats.render(args.served_model_name[0]).encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not self._authorized(path):
            return
        if path == "/reset_prefix_cache" and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
            # vLLM's dev-mode route (vllm/entrypoints/serve/dev/cache/api_router.py): {"success": bool}
            self._json(200, {"success": self.server.stats.reset_prefix_cache()})
            return
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._json(404 if path not in dict(ROUTES) else 405, {"detail": "Not Found"})
            return
        try:
            try:
                body = json.loads(raw or b"null")
            except ValueError as exc:
                raise ApiError(400, f"JSON decode error: {exc}") from None
            answer = Answer(self.server, body, chat=path == "/v1/chat/completions")
        except ApiError as err:
            self._json(err.status, err.body())
            return
        every = self.server.controls.integer("K3SIM_FAIL_EVERY", 0)
        if every != self.server.fail_every[0]:
            self.server.fail_every = (every, itertools.count(1))
        if every > 0 and next(self.server.fail_every[1]) % every == 0:
            # vLLM's EngineDeadError text (vllm/v1/engine/exceptions.py), answered as a 500
            failed = ApiError(500, ENGINE_DEAD, "InternalServerError")
            self._json(failed.status, failed.body())
            return
        stats = self.server.stats
        engine = self.server.coordinator.route()
        if stats.start(engine, answer) and self.server.controls.flag("K3SIM_CACHE_HIT_DIFFERS"):
            answer.script = [(channel, word[::-1]) for channel, word in answer.script]  # a cache that corrupts
        try:
            if answer.stream:
                self._stream(answer, engine)
            else:
                self.server.coordinator.run_on(engine, answer.completion_tokens)
                self._json(200, self._whole(answer))
        finally:
            stats.finish(engine, answer)

    def _whole(self, a: Answer) -> dict[str, Any]:
        created = int(time.time())
        if not a.chat:
            return {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": created,
                "model": a.model,
                "choices": [{"index": 0, "text": a.text("content") or "", "logprobs": None,
                             "finish_reason": a.finish, "stop_reason": None, "prompt_logprobs": None}],
                "usage": a.usage(),
            }  # fmt: skip
        message: dict[str, Any] = {
            "role": "assistant",
            "content": a.text("content"),
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [a.tool_call] if a.tool_call else [],
            "reasoning": a.text("reasoning"),
        }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": a.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": a.finish,
                         "stop_reason": None}],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": a.usage(),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }  # fmt: skip

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _stream(self, a: Answer, engine: int) -> None:
        coordinator, controls = self.server.coordinator, self.server.controls
        cid, created = f"{'chatcmpl' if a.chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        kind = "chat.completion.chunk" if a.chat else "text_completion"

        def event(choice: dict[str, Any] | None, usage: dict[str, int] | None = None) -> None:
            data: dict[str, Any] = {"id": cid, "object": kind, "created": created, "model": a.model}
            data["choices"] = [choice] if choice is not None else []
            if usage is not None:
                data["usage"] = usage
            self._chunk(b"data: " + json.dumps(data).encode() + b"\n\n")

        coordinator.run_on(engine, 1)  # the first token: a dead or hanging rank never sends it
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            if a.chat:
                event(
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                )
            for i, (channel, word) in enumerate(a.script):
                if i:
                    pace(controls, 1)
                text = word if i == 0 or a.script[i - 1][0] != channel else " " + word
                if a.chat:
                    event({"index": 0, "delta": {channel: text}, "logprobs": None, "finish_reason": None})
                else:
                    event({"index": 0, "text": text, "logprobs": None, "finish_reason": None})
            if a.tool_call:
                call = a.tool_call
                head = {"index": 0, "id": call["id"], "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""}}  # fmt: skip
                event({"index": 0, "delta": {"tool_calls": [head]}, "logprobs": None, "finish_reason": None})
                rest = {"index": 0, "function": {"arguments": call["function"]["arguments"]}}
                event({"index": 0, "delta": {"tool_calls": [rest]}, "logprobs": None, "finish_reason": None})
            last: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": a.finish, "stop_reason": None}
            last.update({"delta": {}} if a.chat else {"text": ""})
            event(last)
            if a.include_usage:
                event(None, a.usage())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


# --------------------------------------------------------------------------- main


def serve(args: argparse.Namespace) -> int:
    controls = Controls(dict(os.environ), args.data_parallel_start_rank if args.headless else 0)
    api = f"APIServer pid={LOG.pid}"
    proc = "" if args.headless else api

    def stop(_sig: int, _frame: Any) -> None:  # `docker stop`: PID 1 has no default SIGTERM action
        if not args.headless:
            LOG.write(f"({api}) INFO:     Shutting down")
            LOG.write(f"({api}) INFO:     Waiting for application shutdown.")
            LOG.write(f"({api}) INFO:     Application shutdown complete.")
        die(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    LOG.info("__init__.py:36", "Available plugins for group vllm.platform_plugins:", proc)
    LOG.info("__init__.py:38", "- ascend -> vllm_ascend:register", proc)
    LOG.info(
        "__init__.py:41",
        "All plugins in this group will be loaded. Set `VLLM_PLUGINS` to control which plugins to load.",
        proc,
    )
    LOG.info("__init__.py:207", "Platform plugin ascend is activated", proc)
    LOG.info("k3sim.py:1", "k3deploy test-bed stand-in for vllm serve: no model is loaded", proc)
    if not args.headless:
        LOG.info("api_server.py:1896", f"vLLM API server version {vllm_version()}", proc)
    defaults = vars(build_parser().parse_args(["serve"]))
    changed = {k: v for k, v in vars(args).items() if k in defaults and v != defaults[k] and k != "subparser"}
    LOG.info("utils.py:233", f"non-default args: {changed}", proc)
    threading.Thread(target=watch, args=(controls, proc or api), daemon=True, name="k3sim-watch").start()
    LOG.info("model.py:547", f"Resolved architecture: {architecture(args.model)}", proc)
    max_len = check_config(args, controls, proc or api)
    LOG.info("model.py:1510", f"Using max model len {max_len}", proc)
    if args.max_num_batched_tokens:
        LOG.info(
            "scheduler.py:205",
            f"Chunked prefill is enabled with max_num_batched_tokens={args.max_num_batched_tokens}.",
            proc,
        )

    if args.headless:
        headless(args, controls, max_len)
        return 0

    coordinator = Coordinator(args, controls)
    server = Server(args, controls, coordinator, max_len)
    try:
        server.server_bind()  # early, like vLLM: a taken port fails before the model loads
    except OSError as exc:
        where = f'  File "{SITE}/vllm/entrypoints/openai/api_server.py", line 1870, in create_server_socket'
        fail(api, [where, f"OSError: [Errno {exc.errno}] {exc.strerror}"])
    coordinator.bind()
    for rank in coordinator.local_ranks:
        engine_startup(args, controls, rank, args.data_parallel_size, max_len, 0.0)
    deadline = float(os.environ.get("VLLM_ENGINE_READY_TIMEOUT_S") or DEFAULT_ENGINE_READY_TIMEOUT_S)
    next_log = elapsed() + WAIT_LOG_INTERVAL_S
    while waiting := coordinator.remote_waiting():
        if elapsed() >= deadline:
            fail(
                api,
                [
                    f'  File "{SITE}/vllm/v1/engine/utils.py", line 1078, in wait_for_engine_startup',
                    "RuntimeError: Timed out waiting for engine core processes to start. This is often caused by slow "
                    f"weight loading for large models. Waiting timed out after {deadline:g} seconds "
                    "(VLLM_ENGINE_READY_TIMEOUT_S).",
                ],
            )
        if elapsed() >= next_log:
            LOG.debug(  # vLLM logs this at debug level (vllm/v1/engine/utils.py wait_for_engine_startup)
                "utils.py:1029",
                f"Waiting for 0 local, {waiting} remote core engine proc(s) to start.",
                api,
            )
            next_log += WAIT_LOG_INTERVAL_S
        time.sleep(TICK_S)
    server.server_activate()
    threading.Thread(target=server.serve_forever, daemon=True, name="http").start()
    LOG.info("api_server.py:1634", "Supported_tasks: ['generate']", api)
    shown = args.host or "0.0.0.0"
    LOG.info("api_server.py:1912", f"Starting vLLM API server 0 on http://{shown}:{args.port}", api)
    LOG.info("launcher.py:34", "Available routes are:", api)
    for route, method in ROUTES:
        LOG.info("launcher.py:42", f"Route: {route}, Methods: {method}", api)
    LOG.write(f"({api}) INFO:     Started server process [{LOG.pid}]")
    LOG.write(f"({api}) INFO:     Waiting for application startup.")
    LOG.write(f"({api}) INFO:     Application startup complete.")
    threading.Event().wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
