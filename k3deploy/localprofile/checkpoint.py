"""A tiny Kimi-K3-shaped checkpoint (Llama weights, K3 XTML chat markup) that real vLLM CPU serves.

Scripted variant: every layer's weights are zero, so the hidden state is the current token's embedding; each script
token has a one-hot embedding and an lm_head column that points at the next script token, so greedy decoding walks a
fixed script from the generation prompt's last token. K3 markers and text chunks are single added tokens (one exception,
see SCRIPTS), so every token has exactly one successor; thinking on and off start from different prompt tokens.
Off its script (a successor the engine's grammar forbids, or any other token) the model follows a fixed preference
that depends on the token it is at (FALLBACKS): under a structured-output grammar it writes the shortest text the
grammar allows — `""` for a string, `1` for a number, `[]`, one argument — and ends, never free whitespace, so that
whatever the engine's grammar leaves to the model is answered as briefly as the grammar permits.
The random variant keeps tokenizer and template but draws every weight at random: requests work, no tool call parses.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from k3deploy.tasks.tool_call import TOOL_SCHEMA

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 2, 4, 2, 64
MAX_POSITIONS = 4096

EOS = "<|end_of_msg|>"
OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
THINK_OPEN, THINK_CLOSE = f"{OPEN}think{SEP}", f"{CLOSE}think{SEP}"
RESPONSE_OPEN, RESPONSE_CLOSE = f"{OPEN}response{SEP}", f"{CLOSE}response{SEP}"
TOOLS_OPEN, TOOLS_CLOSE = f"{OPEN}tools{SEP}", f"{CLOSE}tools{SEP}"
MESSAGE_CLOSE = f"{CLOSE}message{SEP}"
RESPONSE_SEP = f"response{SEP}"
EMPTY_STRING = '""'  # one token: an empty JSON string in a single step, so a lone `"` is only ever a needed one

# The smoke stage's tool-call request is what the script answers: the same tool, question and arguments.
TOOL_NAME = TOOL_SCHEMA["function"]["name"]
TOOL_ARGUMENTS = {"city": "Paris"}
REASONING = "I should call get_weather for Paris."
TOOL_CONTENT = "Let me look up the weather in Paris."
PLAIN_CONTENT = "Hello from the tiny scripted Kimi-K3 model."
CALL_OPEN = f'{OPEN}call tool="{TOOL_NAME}" index="1"{SEP}'
ARGUMENT_OPEN = f'{OPEN}argument key="city" type="string"{SEP}'

# Greedy paths, each starting at a generation prompt's last token. In the thinking path the response channel opens
# as the three tokens <|open|> response <|sep|> (how the real K3 vocabulary spells it): the one-token form ends the
# non-thinking prompt and leads to PLAIN_CONTENT, so the two paths never share a token with different successors.
SCRIPTS: dict[str, list[str]] = {
    "thinking": [
        THINK_OPEN, REASONING, THINK_CLOSE, OPEN, "response", SEP, TOOL_CONTENT, RESPONSE_CLOSE, TOOLS_OPEN,
        CALL_OPEN, ARGUMENT_OPEN, TOOL_ARGUMENTS["city"], f"{CLOSE}argument{SEP}", f"{CLOSE}call{SEP}", TOOLS_CLOSE,
        MESSAGE_CLOSE, EOS,
    ],
    # The response channel closes as K3 closes it, spelt <|close|> + "response<|sep|>" (the fused form leads to tools).
    "instant": [RESPONSE_OPEN, PLAIN_CONTENT, CLOSE, RESPONSE_SEP, MESSAGE_CLOSE, EOS],
}  # fmt: skip

SPECIAL_TOKENS = [
    EOS, OPEN, CLOSE, SEP, THINK_OPEN, THINK_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, TOOLS_OPEN, TOOLS_CLOSE,
    CALL_OPEN, ARGUMENT_OPEN, f"{CLOSE}argument{SEP}", f"{CLOSE}call{SEP}", MESSAGE_CLOSE,
]  # fmt: skip
TEXT_TOKENS = ["response", REASONING, TOOL_CONTENT, TOOL_ARGUMENTS["city"], PLAIN_CONTENT, RESPONSE_SEP, EMPTY_STRING]

# Off the script, the tokens the model prefers, most preferred first, by the kind of token it is at (byte-level
# spellings: "Ġ" is a space). Each order ends every free stretch a grammar may allow: a JSON string is closed by `"`
# (or is `""` at once), an XTML argument value by its closing marker, a number after one digit, an array or object
# before it takes another member; the attribute text of an argument tag by `<|sep|>`. Whitespace and every token not
# listed come last, whitespace lowest.
CLOSERS = [f"{CLOSE}argument{SEP}", f"{CLOSE}call{SEP}", TOOLS_CLOSE, RESPONSE_CLOSE, MESSAGE_CLOSE]
STRUCTURE = ["}", "]", ","]
ONWARD = [":", "@", ".", "Z"]  # what moves a formatted string on (a time, an address, a zone) rather than repeat a char
DIGITS = list("1023456789")
WORDS = ["t", "f", "n", "-", "e", "[", "{", *"abcdghijklmopqrsuvwxyz", *"ABCDEFGHIJKLMNOPQRSTUVXY", OPEN, "<"]
FALLBACKS: dict[str, list[str]] = {
    # most tokens (a character inside a value): close the string, else the structure, else the argument
    "generic": [EMPTY_STRING, '"', *STRUCTURE, *CLOSERS, SEP, *ONWARD, *DIGITS, *WORDS],
    # } ] , : inside a string that may not end yet, move on rather than repeat; in JSON, close the structure
    "structure": [EMPTY_STRING, '"', *ONWARD, *CLOSERS, SEP, *STRUCTURE, *DIGITS, *WORDS],
    # a digit: end the number (or the argument) before another digit; a digit only when nothing else fits
    "digit": [EMPTY_STRING, '"', *STRUCTURE, *CLOSERS, SEP, *ONWARD, *WORDS, *DIGITS],
    # a lone quote: an opening one that could not be "" (a string with constraints) or a closing one
    "quote": [*STRUCTURE, *CLOSERS, SEP, *ONWARD, *DIGITS, *WORDS],
    # an empty string just written: in an argument's raw text, end the argument; in JSON, the structure
    "empty": [*CLOSERS, SEP, *STRUCTURE, *ONWARD, *DIGITS, *WORDS],
    # <|sep|> and the script's text: an argument's raw value (or the response channel) ends here
    "text": [*CLOSERS, *STRUCTURE, EMPTY_STRING, '"', SEP, *ONWARD, *DIGITS, *WORDS],
    # a space inside a tag: an argument tag names its key (k…), else its attribute text ends at <|sep|>
    "space": ["k", SEP, EMPTY_STRING, '"', *STRUCTURE, *CLOSERS, *ONWARD, *DIGITS, *WORDS],
    # a closing marker off its script (inside a value): close the value, never another marker
    "closer": [EMPTY_STRING, '"', *STRUCTURE, SEP, *ONWARD, *DIGITS, *WORDS],
}
TEXT_CLASS = {SEP, "response", REASONING, TOOL_CONTENT, TOOL_ARGUMENTS["city"], PLAIN_CONTENT, RESPONSE_SEP}
WHITESPACE = ["Ġ", "Ċ", "ĉ", "č"]

# Transformers renders this with trim_blocks and lstrip_blocks; every tag trims, so no stray whitespace either way.
# `thinking` (default on) picks the generation prompt; tool results carry the `tool`/`index` vLLM's K3 renderer adds.
CHAT_TEMPLATE = "".join(
    [
        "{%- macro attr(v) -%}{{ (v | string).replace('&', '&amp;').replace('\"', '&quot;') }}{%- endmacro -%}",
        "{%- macro xtml_type(v) -%}",
        "{%- if v is string -%}string{%- elif v is boolean -%}boolean{%- elif v is number -%}number",
        "{%- elif v is none -%}null{%- elif v is mapping -%}object{%- else -%}array{%- endif -%}",
        "{%- endmacro -%}",
        "{%- if thinking is not defined or thinking is none -%}{%- set thinking = true -%}{%- endif -%}",
        "{%- if tools -%}",
        '<|open|>message role="system"<|sep|><|open|>tools<|sep|>',
        "{%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}",
        '<|open|>tool name="{{ attr(f.name) }}"<|sep|>{{ f | tojson }}<|close|>tool<|sep|>',
        "{%- endfor -%}",
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
        "{%- endif -%}",
        "{%- for m in messages -%}",
        '<|open|>message role="{{ m.role }}"',
        '{%- if m.role == \'tool\' and m.tool is defined %} tool="{{ attr(m.tool) }}" index="{{ m.index }}"',
        "{%- endif -%}<|sep|>",
        "{%- if m.role == 'assistant' -%}",
        "{%- if m.content -%}<|open|>response<|sep|>{{ m.content }}<|close|>response<|sep|>{%- endif -%}",
        "{%- if m.tool_calls -%}<|open|>tools<|sep|>",
        "{%- for tc in m.tool_calls -%}{%- set f = tc.function if tc.function is defined else tc -%}",
        '<|open|>call tool="{{ attr(f.name) }}" index="{{ loop.index }}"<|sep|>',
        "{%- if f.arguments is mapping -%}{%- for k, v in f.arguments.items() -%}",
        '<|open|>argument key="{{ attr(k) }}" type="{{ xtml_type(v) }}"<|sep|>',
        "{%- if v is string -%}{{ v }}{%- else -%}{{ v | tojson }}{%- endif -%}<|close|>argument<|sep|>",
        "{%- endfor -%}{%- elif f.arguments -%}",
        '<|open|>argument key="arguments" type="object"<|sep|>{{ f.arguments }}<|close|>argument<|sep|>',
        "{%- endif -%}<|close|>call<|sep|>",
        "{%- endfor -%}<|close|>tools<|sep|>",
        "{%- endif -%}",
        "{%- elif m.content is string -%}{{ m.content }}{%- elif m.content is not none -%}{{ m.content | tojson }}",
        "{%- endif -%}",
        "<|close|>message<|sep|><|end_of_msg|>",
        "{%- endfor -%}",
        "{%- if add_generation_prompt -%}",
        '<|open|>message role="assistant"<|sep|>',
        "{%- if thinking -%}<|open|>think<|sep|>{%- else -%}<|open|>response<|sep|>{%- endif -%}",
        "{%- endif -%}",
    ]
)


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE over the 256 byte symbols (any text encodes) plus the K3 markers and the script's text chunks."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TEXT_TOKENS])
    return tokenizer


def successors() -> dict[str, str]:
    """Each script token's one next token (the end-of-message token repeats itself)."""
    following: dict[str, str] = {EOS: EOS}
    for path in SCRIPTS.values():
        for token, nxt in itertools.pairwise(path):
            if following.setdefault(token, nxt) != nxt:
                raise ValueError(f"script token {token!r} would need two successors")
    return following


def token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """Script token string -> id; each must be exactly one token."""
    ids: dict[str, int] = {}
    for token in successors():
        encoded = tokenizer.encode(token, add_special_tokens=False).ids
        if len(encoded) != 1:
            raise ValueError(f"script token {token!r} encodes to {len(encoded)} tokens")
        ids[token] = encoded[0]
    return ids


def _weights(
    vocab: int, scripted: bool, ids: dict[str, int], seed: int, lookup: dict[str, int]
) -> dict[str, np.ndarray]:
    """`ids`: the script's tokens; `lookup`: every token's id by its text (byte symbols and added tokens)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab, HIDDEN)}
    shapes = {
        "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
        "mlp.up_proj": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTERMEDIATE),
    }
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        for name, shape in shapes.items():
            weight = normal(*shape)
            tensors[f"{prefix}.{name}.weight"] = np.zeros_like(weight) if scripted else weight
        tensors[f"{prefix}.input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        tensors[f"{prefix}.post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    tensors["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    lm_head = normal(vocab, HIDDEN)
    if scripted:
        embed = tensors["model.embed_tokens.weight"]
        dims = {token: dim for dim, token in enumerate(ids)}  # one hidden dimension per script token
        kinds = {kind: len(dims) + i for i, kind in enumerate(FALLBACKS)}  # and one per kind of token
        embed[:, :] = 0.0
        lm_head[:, :] = 0.0
        named = {token_id: text for text, token_id in lookup.items()}
        for token_id in range(vocab):
            embed[token_id, kinds[kind_of(named.get(token_id, ""))]] = 1.0
        for kind, order in FALLBACKS.items():
            lm_head[:, kinds[kind]] = preference(vocab, lookup, order)
        for token, nxt in successors().items():
            embed[ids[token], dims[token]] = 1.0
            lm_head[ids[nxt], dims[token]] = 1.0  # the successor's 1 beats any preference (all below 0.5)
    tensors["lm_head.weight"] = lm_head
    return tensors


def kind_of(token: str) -> str:
    """Which FALLBACKS order a token (by its text in the vocabulary) follows off its script."""
    if token in CLOSERS:
        return "closer"
    if token in TEXT_CLASS:
        return "text"
    if token in STRUCTURE:
        return "structure"
    if token in DIGITS:
        return "digit"
    return {EMPTY_STRING: "empty", '"': "quote", "Ġ": "space"}.get(token, "generic")


def preference(vocab: int, lookup: dict[str, int], order: list[str]) -> np.ndarray:
    """Scores off the script: `order` from 0.45 down, unlisted tokens 0.01, whitespace 0 (all below a successor's 1)."""
    scores = np.full(vocab, 0.01, np.float32)
    for token in WHITESPACE:
        scores[lookup[token]] = 0.0
    for rank, token in enumerate(order):
        scores[lookup[token]] = 0.45 - 0.003 * rank
    return scores


def config(vocab: int, eos_id: int) -> dict[str, Any]:
    """The Llama config vLLM CPU serves: head_dim 64 (CPU attention needs 32/64/80/96/112/128)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def write_checkpoint(folder: Path, scripted: bool = True, seed: int = 0) -> list[Path]:
    """Write the checkpoint into `folder` (created if needed); return the files written, sorted."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    ids = token_ids(tokenizer)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    eos_id = ids[EOS]
    written = {
        "config.json": config(vocab, eos_id),
        "generation_config.json": {"eos_token_id": eos_id},
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": EOS,
            "bos_token": None,
            "pad_token": None,
            "model_max_length": MAX_POSITIONS,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    }
    paths = []
    for name, content in written.items():
        path = folder / name
        path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
        paths.append(path)
    tokenizer_path = folder / "tokenizer.json"
    tokenizer_path.write_text(tokenizer.to_str(pretty=True) + "\n")
    weights_path = folder / "model.safetensors"
    save_file(
        _weights(vocab, scripted, ids, seed, tokenizer.get_vocab(with_added_tokens=True)),
        str(weights_path),
        metadata={"format": "pt"},
    )
    return sorted([*paths, tokenizer_path, weights_path])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the tiny Kimi-K3-shaped checkpoint of the local profile.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--random", action="store_true", help="random weights instead of the scripted ones")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for path in write_checkpoint(args.folder, scripted=not args.random, seed=args.seed):
        print(f"{path.stat().st_size:>10}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
