"""Small checkpoints for the local hub: the files the models stage's content checks look for."""

from __future__ import annotations

import json
import random

SHARD = "model-00001-of-00002.safetensors"


def checkpoint_files(seed: int, shard_bytes: int = 3 * 1024 * 1024 + 7) -> dict[str, bytes]:
    rnd = random.Random(seed)
    return {
        "config.json": json.dumps({"architectures": ["KimiK3ForCausalLM"], "vocab_size": 1000}).encode(),
        "quant_model_description.json": json.dumps({"model_quant_type": "W4A8_DYNAMIC"}).encode(),
        "tokenizer_config.json": b'{"tokenizer_class": "PreTrainedTokenizerFast"}',
        "tokenizer.json": rnd.randbytes(3000),
        "preprocessor_config.json": b'{"image_processor_type": "KimiK3ImageProcessor"}',
        SHARD: rnd.randbytes(shard_bytes),
        "model-00002-of-00002.safetensors": rnd.randbytes(1024 * 1024 + 1),
    }
