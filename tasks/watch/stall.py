"""A stuck DP rank seen in node 0's /metrics: requests running on it, yet no token processed for too long.

A rank that dies is seen by its exit; one that hangs (a collective that never completes, an engine
loop stuck) keeps its process and /health, and the requests routed to it simply never end. vLLM
counts, per DP engine, the requests in its running batch (`vllm:num_requests_running`) and the
prompt and generation tokens it processed (`*_tokens_total`): while requests run, the token
counters move every step. Pure: readings in, stuck engines out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from k3deploy.tasks import metrics

RUNNING = "vllm:num_requests_running"
PROGRESS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


@dataclass(frozen=True)
class EngineReading:
    """One engine's figures in one /metrics reading."""

    running: float
    tokens: float


def readings(text: str) -> dict[str, EngineReading]:
    """Per `engine` label: requests running and tokens processed so far (prompt + generation)."""
    samples = metrics.parse(text)
    running = metrics.per_engine(samples, RUNNING)
    tokens: dict[str, float] = {}
    for name in PROGRESS:
        for engine, value in metrics.per_engine(samples, name).items():
            tokens[engine] = tokens.get(engine, 0.0) + value
    return {e: EngineReading(running.get(e, 0.0), tokens.get(e, 0.0)) for e in sorted(set(running) | set(tokens))}


@dataclass(frozen=True)
class Stuck:
    """An engine with requests running and no token processed for `seconds`."""

    engine: str
    running: int
    seconds: float


@dataclass
class StallDetector:
    """Fed readings with their times; says which engines have been stuck for at least `timeout_s`.

    An engine's clock starts at the first reading in which it has requests running and restarts
    whenever its token count moves or it runs nothing.
    """

    timeout_s: float
    _since: dict[str, tuple[float, float]] = field(default_factory=dict)  # engine → (since, tokens then)

    def observe(self, at: float, seen: dict[str, EngineReading]) -> list[Stuck]:
        stuck = []
        for engine, reading in seen.items():
            started = self._since.get(engine)
            if reading.running <= 0 or started is None or reading.tokens != started[1]:
                self._since[engine] = started = (at, reading.tokens)
            if reading.running > 0 and at - started[0] >= self.timeout_s:
                stuck.append(Stuck(engine, int(reading.running), round(at - started[0], 1)))
        return stuck
