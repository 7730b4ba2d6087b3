"""Pure checks of the models stage: disk space, agreement across nodes, what the checkpoints must hold.

Inputs are hub listings and the small JSON files read back from a node (config.json, the
quantization description); nothing here does I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from k3deploy.blocks.models import SPECULATIVE_TOKENS, DraftSpec
from k3deploy.core.agreement import majority, split
from k3deploy.core.stage import FailureClass, Finding
from k3deploy.tasks.models.listing import Listing
from k3deploy.tasks.node.node_agent import Manifest

TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_VOCAB = ("tokenizer.json", "tokenizer.model", "tiktoken.model")
TOKENIZER_FILES = (TOKENIZER_CONFIG, *TOKENIZER_VOCAB, "special_tokens_map.json", "chat_template.jinja")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
QUANT_DESCRIPTION = "quant_model_description.json"  # msModelSlim's metadata, read by vLLM-Ascend
ROTATION = re.compile(r"quarot|rotation|hadamard", re.IGNORECASE)
DOCUMENTS = ("config.json", QUANT_DESCRIPTION)  # read back from node 0 for the checks below


@dataclass(frozen=True)
class SpaceNeed:
    node: str
    device: int
    missing_bytes: int
    free_bytes: int


def space_problems(needs: Iterable[SpaceNeed]) -> list[str]:
    """Nodes whose filesystem cannot take the bytes still missing; checkpoints on one device add up."""
    per_device: dict[tuple[str, int], list[int]] = {}
    for need in needs:
        missing, free = per_device.setdefault((need.node, need.device), [0, need.free_bytes])
        per_device[need.node, need.device] = [missing + need.missing_bytes, min(free, need.free_bytes)]
    return [
        f"{node}: {missing / 1e9:.3f} GB still to download but only {free / 1e9:.3f} GB free at the model root"
        for (node, _), (missing, free) in per_device.items()
        if missing > free
    ]


def differing_nodes(manifests: dict[str, Manifest], files: Iterable[str]) -> dict[str, str]:
    """Nodes whose manifest disagrees with the majority on commit or any file: node → why."""
    if not manifests:
        return {}
    paths = sorted(files)

    def key(m: Manifest) -> tuple[str, tuple[tuple[str, str | None], ...]]:
        return m.commit, tuple((p, (m.files[p].sha256 or m.files[p].git_blob) if p in m.files else None) for p in paths)

    keys = {node: key(m) for node, m in manifests.items()}
    usual = majority(keys.values())
    if usual is None:
        variants = {
            k: f"copy {chr(65 + i)} (commit {k[0] or 'none complete'})"
            for i, k in enumerate(dict.fromkeys(keys.values()))
        }
        return dict.fromkeys(keys, f"no majority of nodes hold the same files: {split(keys, variants.__getitem__)}")
    out = {}
    for node, k in keys.items():
        if k == usual:
            continue
        if k[0] != usual[0]:
            out[node] = f"commit {k[0] or '(none complete)'}, the other nodes have {usual[0] or '(none complete)'}"
        else:
            bad = [p for (p, h), (_, mh) in zip(k[1], usual[1], strict=True) if h != mh]
            out[node] = f"{len(bad)} file(s) differ: {', '.join(bad[:5])}"
    return out


def _paths(listing: Listing) -> set[str]:
    return {f.path for f in listing.files}


def _checksums(listing: Listing) -> dict[str, str | None]:
    return {f.path: f.sha256 or f.git_blob for f in listing.files}


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs keep the language model's sizes under text_config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


# The keys vLLM 0.32 takes a checkpoint's longest context from (vllm/transformers_utils/
# model_arch_config_convertor.py, derive_max_model_len_and_key: the smallest of those present, but
# model_max_length when set), and the RoPE kinds whose factor it does not apply again (vllm/config/model.py,
# _get_and_verify_max_len: YaRN's max_position_embeddings is already scaled).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")  # fmt: skip
ROPE_NOT_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def derived_max_len(config: Mapping[str, Any]) -> tuple[float, str] | None:
    """The longest context a checkpoint's config.json allows, as vLLM derives it; None when it names none.
    (vLLM also caps it by tokenizer_config.json's model_max_length: not read here, so a limit it adds is left
    to the engine.)"""
    text = _text_config(config)

    def number(key: str) -> float | None:
        value = text.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    found = sorted((v, k) for k in MAX_LEN_KEYS if (v := number(k)) is not None)
    if not found:
        return None
    limit, key = (number("model_max_length"), "model_max_length") if number("model_max_length") else found[0]
    assert limit is not None
    factor = 1.0
    if "gemma3" not in str(config.get("model_type", "")):  # its max already scaled
        for rope in _rope_parameters(text):
            kind, value = rope.get("rope_type", rope.get("type")), rope.get("factor")
            if kind not in ROPE_NOT_SCALED and isinstance(value, int | float) and not isinstance(value, bool):
                factor = float(value)
    return limit * factor, key + (f" × RoPE factor {factor:g}" if factor != 1.0 else "")


def _rope_parameters(text: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """rope_scaling (transformers ≤ 4) or rope_parameters (one, or one per layer kind)."""
    found = []
    for name in ("rope_scaling", "rope_parameters"):
        value = text.get(name)
        if isinstance(value, Mapping):
            inner = [v for v in value.values() if isinstance(v, Mapping)]
            found += inner if inner and not ("rope_type" in value or "type" in value) else [value]
    return found


def max_len_findings(config: Mapping[str, Any], max_model_len: int | None, allow_long: bool) -> list[Finding]:
    """serve.max_model_len against the target's config.json, as vLLM checks it at start-up: refused here, before
    a two-hour load on every node, with the field and the checkpoint's own limit named."""
    if max_model_len is None:
        return []
    derived = derived_max_len(config)
    if derived is None:
        keys = ", ".join(MAX_LEN_KEYS[:3])
        return [
            Finding("target", "serve.max_model_len", True, f"{max_model_len}: not checked, config.json has no {keys} …")
        ]
    limit, key = derived
    if max_model_len <= limit:
        return [Finding("target", "serve.max_model_len", True, f"{max_model_len} ≤ {limit:g} (config.json {key})")]
    if allow_long:
        detail = (f"{max_model_len} > {limit:g} (config.json {key}), allowed by VLLM_ALLOW_LONG_MAX_MODEL_LEN: "
                  "positions past it give NaN with RoPE")  # fmt: skip
        return [Finding("target", "serve.max_model_len", True, detail)]
    detail = (f"{max_model_len} is above the checkpoint's {limit:g} (config.json {key}): vLLM refuses to start "
              "(\"User-specified max_model_len … is greater than the derived max_model_len\"); lower "
              "serve.max_model_len, or set serve.env VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if the model is known to "
              "hold it")  # fmt: skip
    return [Finding("target", "serve.max_model_len", False, detail, cause=FailureClass.CONFIGURATION)]


def tokenizer_findings(role: str, listing: Listing, vision: bool = True) -> list[Finding]:
    """The tokenizer and processor files the server loads must be in the checkpoint; the processor's only
    when config.json declares a vision tower (`vision_config`)."""
    paths = _paths(listing)
    vocab = [p for p in TOKENIZER_VOCAB if p in paths] + sorted(p for p in paths if p.endswith(".tiktoken"))
    has_tokenizer = TOKENIZER_CONFIG in paths and bool(vocab)
    processor = [p for p in PROCESSOR_FILES if p in paths]
    return [
        Finding(
            role,
            "tokenizer files",
            has_tokenizer,
            f"{TOKENIZER_CONFIG} + {', '.join(vocab)}"
            if has_tokenizer
            else f"needs {TOKENIZER_CONFIG} and one of "
            f"{', '.join(TOKENIZER_VOCAB)}; the checkpoint lists {sorted(paths & set(TOKENIZER_FILES)) or 'none'}",
        ),
        Finding(
            role,
            "processor files",
            bool(processor) or not vision,
            ", ".join(processor)
            or (
                f"none of {', '.join(PROCESSOR_FILES)}: image requests cannot be processed"
                if vision
                else "not applicable: config.json declares no vision tower (vision_config)"
            ),
        ),
    ]


def quantization_findings(role: str, listing: Listing, description: str | None) -> list[Finding]:
    """W4A8 on Ascend needs msModelSlim's description; QuaRot checkpoints also their rotation tensors."""
    if description is None:
        return [Finding(role, "quantization metadata", False, f"{QUANT_DESCRIPTION} is not in the checkpoint")]
    try:
        parsed = json.loads(description)
    except ValueError as err:
        return [Finding(role, "quantization metadata", False, f"{QUANT_DESCRIPTION} is not JSON: {err}")]
    kinds = sorted({str(v) for v in parsed.values() if isinstance(v, str)}) if isinstance(parsed, dict) else []
    found = [Finding(role, "quantization metadata", True, f"{QUANT_DESCRIPTION}: {', '.join(kinds[:6]) or 'present'}")]
    rotation_files = sorted(p for p in _paths(listing) if ROTATION.search(p) and p != QUANT_DESCRIPTION)
    says_rotated = bool(ROTATION.search(description))
    if rotation_files:
        found.append(  # retained: every listed file is verified on every node
            Finding(
                role, "QuaRot rotation tensors", True, f"{len(rotation_files)} file(s): {', '.join(rotation_files)}"
            )
        )
    elif says_rotated:
        found.append(
            Finding(
                role,
                "QuaRot rotation tensors",
                False,
                f"{QUANT_DESCRIPTION} describes a rotated (QuaRot) model but the checkpoint has no rotation tensors",
            )
        )
    return found


def draft_findings(
    target: Listing, draft: Listing, target_config: Mapping[str, Any], draft_config: Mapping[str, Any], spec: DraftSpec
) -> list[Finding]:
    """A draft must share the target's tokenizer and sizes, and match its declared kind and token count."""
    out = []
    shared = sorted(set(TOKENIZER_FILES) & _paths(target) & _paths(draft))
    theirs, ours = _checksums(draft), _checksums(target)
    differ = [p for p in shared if theirs[p] != ours[p]]
    out.append(
        Finding(
            "draft",
            "tokenizer identical to target",
            not differ,
            f"differs from the target's: {', '.join(differ)}"
            if differ
            else (f"same checksums: {', '.join(shared)}" if shared else "the draft ships no tokenizer: the target's"),
        )
    )
    t, d = _text_config(target_config), _text_config(draft_config)
    sizes = [k for k in ("vocab_size", "hidden_size") if k in t and k in d and t[k] != d[k]]
    out.append(
        Finding(
            "draft",
            "architecture compatible",
            not sizes,
            "; ".join(f"{k}: draft {d[k]}, target {t[k]}" for k in sizes)
            or f"vocab_size {d.get('vocab_size', '?')}, hidden_size {d.get('hidden_size', '?')} as the target",
        )
    )
    kind = "mla" if "kv_lora_rank" in d else "gqa"
    declared = (spec.kind or "").removesuffix("-block5")
    if declared:
        out.append(
            Finding("draft", "attention kind", kind == declared, f"config.json is {kind}, configured as {spec.kind}")
        )
    wanted = next((d[k] for k in ("num_speculative_tokens", "block_size") if isinstance(d.get(k), int)), None)
    wanted = wanted or (SPECULATIVE_TOKENS[spec.kind] if spec.kind else None)
    if spec.num_speculative_tokens is not None and wanted is not None:
        out.append(
            Finding(
                "draft",
                "num_speculative_tokens fits the draft",
                spec.num_speculative_tokens == wanted,
                f"configured {spec.num_speculative_tokens}, the draft takes {wanted}",
            )
        )
    return out
