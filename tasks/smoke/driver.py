"""The smoke checks' I/O: send each check's requests to node 0 over HTTP and feed the replies back.

Every request has its own timeout: a dead DP rank leaves its share of requests hanging while
`/health` stays 200 (DESIGN.md), so a wait without one would never end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from k3deploy.core.stage import FailureClass, Finding
from k3deploy.tasks.chat_api import Call, Reply, send
from k3deploy.tasks.smoke.checks import Burst, Check, Context, Outcome


@dataclass(frozen=True)
class Row:
    """One check's row in the smoke table."""

    check: str
    outcome: Outcome
    seconds: float
    unserved: int = 0  # requests that got no answer or a 5xx: the engine's failure, not the model's

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "fail", None: "not-applicable"}[self.outcome.ok]

    def as_dict(self) -> dict[str, Any]:
        """The table's row: the check, its verdict and time, and the request and reply behind it."""
        out = self.outcome
        return {"check": self.check, "verdict": self.verdict, "seconds": self.seconds, "detail": out.detail,
                "request": out.request, "response": out.response}  # fmt: skip

    def finding(self, subject: str) -> Finding:
        """A failed check whose requests were answered is the model's; one left unanswered, the engine's."""
        failed = self.outcome.ok is False
        cause = None
        if failed:
            cause = self.outcome.cause or (FailureClass.ENGINE if self.unserved else FailureClass.MODEL)
        return Finding(subject, self.check, not failed, self.outcome.detail, cause)


Step = Call | Burst
Answer = Reply | list[Reply]


def run_check(
    http: httpx.Client,
    check: Check,
    ctx: Context,
    timeout: float,
    on_step: Callable[[Step, Answer], None] | None = None,
) -> Row:
    """Drive one check to its outcome; `on_step` sees every request and its reply (to record real replies)."""
    started = time.monotonic()
    steps = check.run(ctx)
    unserved = 0
    try:
        step = next(steps)
        while True:
            answer: Answer
            if isinstance(step, Burst):
                with ThreadPoolExecutor(max_workers=len(step.calls)) as pool:
                    answer = list(pool.map(lambda c: send(http, c, timeout), step.calls))
            else:
                answer = send(http, step, timeout)
            if on_step is not None:
                on_step(step, answer)
            unserved += sum(reply.status == 0 or reply.status >= 500 for reply in _replies(answer))
            step = steps.send(answer)
    except StopIteration as done:
        outcome = done.value
    return Row(check.name, outcome, round(time.monotonic() - started, 3), unserved)


def _replies(answer: Answer) -> list[Reply]:
    return answer if isinstance(answer, list) else [answer]


def run_checks(
    base_url: str,
    checks: tuple[Check, ...],
    ctx: Context,
    timeout: float,
    on_row: Callable[[Row], None],
    stop: threading.Event | None = None,
) -> list[Row]:
    """Every check in turn, each row handed to `on_row` as it is done (progress for long checks); no further
    check once `stop` is set (the service was lost: the stage says so, not a row per check)."""
    limits = httpx.Limits(max_connections=ctx.burst + 4, max_keepalive_connections=ctx.burst + 4)
    rows = []
    with httpx.Client(base_url=base_url, limits=limits) as http:
        for check in checks:
            if stop is not None and stop.is_set():
                break
            rows.append(run_check(http, check, ctx, timeout))
            on_row(rows[-1])
    return rows
