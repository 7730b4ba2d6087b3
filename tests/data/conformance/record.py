"""Record real answers of a served local profile to conformance requests, as test data for the scorer and reassembly.

    python tests/data/conformance/record.py --url http://127.0.0.1:18000 --out tests/data/conformance/vllm-0.32.0.json

Sends a fixed set of the suite's cases (the local profile's config: strict tools, max_tokens 512), each whole and
streamed, and keeps each raw reply (status and body text: a stream's SSE text as it came). The server must serve the
local profile's scripted checkpoint with the kimi_k3 tokenizer mode and parsers (configs/local.yaml).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.chat_api import CHAT, Call, send
from k3deploy.tasks.conformance import cases as c
from k3deploy.tasks.conformance.corpus import corpus

ROOT = Path(__file__).parents[3]
# corpus 0: all optional; 1: one required of two (the model misses it); 4: a nested required object; 51: a pattern
SCHEMAS = (0, 1, 4, 51)


def chosen() -> list[c.Case]:
    cfg = load_config(str(ROOT / "configs" / "local.yaml"))
    model, tokens = cfg.serve.served_model_name, cfg.conformance.max_tokens
    schemas = corpus()
    picked = [c.forced(schemas[i], model, tokens, strict=True) for i in SCHEMAS]
    picked += [c.auto("with-decoy", c.AUTO_TOOLSETS["with-decoy"], model, tokens)]
    picked += c.reasoning_cases(model, tokens)
    picked += [
        case for case in c.choice_cases(schemas, model, tokens) if case.id in ("choice/none", "format/json_object")
    ]
    picked += [c.usage_case(k, v, 0) for k, v in c.usage_bodies(model, tokens).items() if k == "usage/tools"]
    paired = [variant for case in picked for variant in (case, case.streamed())]
    wanted = ("params/temperature -1", "params/n 0", "params/thinking_effort 'extreme'")
    return paired + [p for p in c.params_cases(model, tokens) if p.id in wanted]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    replies = {}
    with httpx.Client(base_url=args.url) as http:
        for case in chosen():
            reply = send(http, Call("POST", CHAT, case.body, stream=case.stream), 120)
            replies[f"{case.id} {case.mode}"] = {"status": reply.status, "text": reply.text, "body": case.body}
    args.out.write_text(json.dumps(replies, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(replies)} replies in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
