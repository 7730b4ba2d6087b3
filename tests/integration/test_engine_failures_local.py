"""Start-up failures of the real CPU vLLM, each a mistake a site makes in its configuration, provoked as a person
meets them (`k3deploy run -c … --only launch`): the CLI's final table and the record name the engine's own cause
line (tasks/watch/cause.py), the node and DP rank, where the line is in the rank's log, its family and whose
problem it is; launch ends within seconds of the line, and nothing is left running.

The profile is narrowed to one node and DP rank, and its checkpoint is written into the test's own folder (the
scripted tiny checkpoint, offline), so `--only launch` needs nothing from the other stages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from k3deploy.blocks.loader import load_config
from k3deploy.localprofile.checkpoint import write_checkpoint
from tests.bedconfig import write_config
from tests.cli_run import k3deploy_run, log_file, table_rows
from tests.ports import port_free

pytestmark = [pytest.mark.launch, pytest.mark.faults, pytest.mark.cli, pytest.mark.vllm, pytest.mark.prefect]
PROFILE = Path(__file__).parents[2] / "configs" / "local.yaml"


def damage_header(checkpoint: Path) -> None:
    """A safetensors file whose header length says more bytes than the file has: a copy cut short."""
    weights = next(checkpoint.glob("*.safetensors"))
    data = weights.read_bytes()
    weights.write_bytes((len(data) * 4).to_bytes(8, "little") + data[8:])


# (name, what the site got wrong, the engine's words in its cause line, the family, whose problem)
FAULTS = [
    ("tool-call-parser", {"serve": {"tool_call_parser": "no_such_parser"}},
     "invalid tool call parser: no_such_parser", "parser_unknown", "configuration"),
    ("kv-cache-too-small", {"serve": {"extra_args": ["--enforce-eager", "--num-gpu-blocks-override", "1"]}},
     "KV cache", "kv_cache_small", "configuration"),
    ("kv-cache-space-not-a-number", {"serve": {"env": {"VLLM_CPU_KVCACHE_SPACE": "0.001"}}},
     "invalid literal for int()", "config_invalid", "configuration"),
    ("damaged-checkpoint", {"damage": True}, "Error while deserializing header", "checkpoint_unreadable", "model"),
]  # fmt: skip


def site(tmp_path: Path, change: dict[str, Any]) -> str:
    data = yaml.safe_load(PROFILE.read_text())
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:1]
    data["cluster"]["model_root"] = str(tmp_path / "models")
    data["serve"]["data_parallel_size"] = 1
    data["serve"]["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one rank: its model in the engine's process
    data["serve"]["process"] = {"state_dir": str(tmp_path / "serving")}
    for section, values in change.items():
        if section != "damage":
            for key, value in values.items():
                data[section][key] = data[section][key] | value if isinstance(value, dict) else value
    checkpoint = tmp_path / "models" / "tiny-kimi-k3"
    write_checkpoint(checkpoint)
    if change.get("damage"):
        damage_header(checkpoint)
    return write_config(tmp_path / "site.yaml", data)


@pytest.mark.parametrize(("name", "change", "words", "family", "whose"), FAULTS, ids=[f[0] for f in FAULTS])
def test_a_start_up_failure_is_named_by_the_engines_own_line(prefect_server, tmp_path, name, change, words, family,
                                                            whose):  # fmt: skip
    config = site(tmp_path, change)
    out = k3deploy_run(config, tmp_path, "--only", "launch")
    assert out.returncode == 1, out.stdout + out.stderr
    rows = {row[0]: row for row in table_rows(out.stdout)}
    assert rows["launch"][1] == "fail", rows["launch"]
    assert words in " ".join(out.stdout.split()), out.stdout  # the engine's words, in the terminal (wrapped)
    record = json.loads((log_file(out.stdout).parent / "record.json").read_text())
    failure = record["failure"]
    assert (failure["failure_class"], failure["family"], failure["node"], failure["dp_rank"]) == (
        whose, family, "local0", 0
    ), failure  # fmt: skip
    assert words in failure["evidence"]
    rank_log = log_file(out.stdout).parent / "logs" / "local0.log"
    # numbered by newlines, as the log file is (a progress bar's carriage returns stay inside their line)
    said = rank_log.read_bytes().decode(errors="replace").split("\n")[failure["log_line"] - 1].strip()
    assert said and said[:300] in failure["evidence"], (said, failure)  # the line the number points at (kept cut)
    under_table = next(line for line in out.stdout.splitlines() if line.startswith("failed at launch: "))
    assert f"{whose}: local0 (DP rank 0), log line {failure['log_line']}: " in under_table
    cfg = load_config(config)
    assert not any(Path(cfg.serve.process.state_dir).glob("*/pid")) and port_free(cfg.serve.service_port)


# Mistakes the pipeline sees before any server starts: the stage that can see it fails naming the field (the
# engine's own line for the same mistake is the case above, provoked with `--only launch`, past that stage).
EARLY = [
    ("max-model-len", "models", {"serve": {"max_model_len": 65536}}, "serve.max_model_len",
     "65536 is above the checkpoint's 4096 (config.json max_position_embeddings)"),
    ("tool-call-parser", "image", {"serve": {"tool_call_parser": "no_such_parser"}}, "serve.tool_call_parser",
     "no_such_parser is not one of the 54 names the image's vLLM knows for --tool-call-parser"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "stage", "change", "field", "words"), EARLY, ids=[e[0] for e in EARLY])
def test_a_mistake_seen_before_launch_fails_that_stage_naming_the_field(prefect_server, tmp_path, name, stage,
                                                                        change, field, words):  # fmt: skip
    out = k3deploy_run(site(tmp_path, change), tmp_path, "--only", stage)
    assert out.returncode == 1, out.stdout + out.stderr
    rows = {row[0]: row for row in table_rows(out.stdout)}
    assert rows[stage][1] == "fail", rows[stage]
    record = json.loads((log_file(out.stdout).parent / "record.json").read_text())
    assert record["failed_stage"] == stage and record["failure"]["failure_class"] == "configuration"
    assert field in record["failure"]["evidence"] and words in record["failure"]["evidence"], record["failure"]
    assert field in " ".join(out.stdout.split())
