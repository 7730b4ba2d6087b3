"""Command builders for the evaluators (no I/O). Both run on the machine running k3deploy, against node 0."""

from __future__ import annotations

import json
import shlex

from k3deploy.blocks.accuracy import AisBenchSettings, LmEvalSettings

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}  # datasets come from the configured local path
AIS_MODEL = "k3deploy_vllm_chat"  # the AISBench model config k3deploy writes (its --config-dir)


def lm_eval_command(settings: LmEvalSettings, model: str, base_url: str, output: str) -> str:
    """`lm_eval run` with local-chat-completions, fixed sampling and per-sample logs, started in include_path."""
    model_args = ",".join(
        [
            f"model={model}",
            f"base_url={base_url}/v1/chat/completions",
            f"num_concurrent={settings.num_concurrent}",
            f"max_retries={settings.max_retries}",
            f"timeout={settings.request_timeout_s:g}",
            "tokenizer_backend=None",
        ]
    )
    argv = [f"{settings.environment.path}/bin/lm_eval", "run", "--model", "local-chat-completions"]
    argv += ["--model_args", model_args, "--apply_chat_template", "--tasks", ",".join(settings.tasks)]
    argv += ["--gen_kwargs", "temperature=0,do_sample=False", "--seed", "0"]
    argv += ["--output_path", output, "--log_samples"]
    if settings.include_path is not None:
        argv += ["--include_path", settings.include_path]
    if settings.limit is not None:
        argv += ["--limit", str(settings.limit)]
    folder = settings.include_path or output
    assignments = " ".join(f"{k}={v}" for k, v in OFFLINE.items())
    return f"cd {shlex.quote(folder)} && env {assignments} {shlex.join(argv)}"


def ais_model_config(settings: AisBenchSettings, model: str, host: str, port: int) -> str:
    """AISBench's vLLM chat model config (its vllm_api_general_chat, pointed at node 0), as a Python file."""
    fields = {
        "attr": "service",
        "abbr": "k3deploy-vllm-chat",
        "path": "",
        "model": model,
        "stream": False,
        "request_rate": 0,
        "use_timestamp": False,
        "retry": 2,
        "api_key": "",
        "host_ip": host,
        "host_port": port,
        "url": "",
        "max_out_len": settings.max_out_len,
        "batch_size": settings.batch_size,
        "trust_remote_code": False,
        "generation_kwargs": {"temperature": 0, "ignore_eos": False},
    }
    body = ",\n".join(f"        {key}={value!r}" for key, value in fields.items())
    return (
        "# Written by k3deploy: AISBench's vllm_api_general_chat pointed at the served endpoint.\n"
        "from ais_bench.benchmark.models import VLLMCustomAPIChat\n"
        "from ais_bench.benchmark.utils.postprocess.model_postprocessors import extract_non_reasoning_content\n\n"
        "models = [\n    dict(\n        type=VLLMCustomAPIChat,\n"
        f"{body},\n        pred_postprocessor=dict(type=extract_non_reasoning_content),\n    )\n]\n"
    )


def ais_command(settings: AisBenchSettings, config_dir: str, work_dir: str) -> str:
    assert settings.dataset_path is not None, "checked when the stage starts"
    argv = [f"{settings.environment.path}/bin/ais_bench", "--config-dir", config_dir, "--models", AIS_MODEL]
    argv += ["--custom-dataset-path", settings.dataset_path, "--mode", "all", "-w", work_dir]
    assignments = " ".join(f"{k}={v}" for k, v in {**OFFLINE, "TERM": "dumb"}.items())  # no curses screen codes
    return f"cd {shlex.quote(work_dir)} && env {assignments} {shlex.join(argv)}"


def version_command(env_path: str, distribution: str) -> str:
    script = f"import importlib.metadata as m; print(m.version({json.dumps(distribution)}))"
    return shlex.join([f"{env_path}/bin/python", "-c", script])
