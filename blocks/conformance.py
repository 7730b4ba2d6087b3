"""Conformance settings: how much of the suite runs, how hard, and what it must score."""

from __future__ import annotations

from pydantic import Field, HttpUrl

from k3deploy.blocks._types import StrictBlock


class ConformanceThresholds(StrictBlock):
    """What the served API must score; every other rule (a forced call's shape, parameters, usage, reasoning) allows
    no failure at all."""

    schema_accuracy: float = Field(
        default=1.0, ge=0, le=1,
        description="Forced tool calls whose arguments validate against their schema, of all forced calls: the floor "
        "in each mode (streamed, whole) and load (alone, under load).",
    )  # fmt: skip
    auto_tool_calls: float = Field(
        default=1.0, ge=0, le=1, description="tool_choice auto cases answered with the expected, valid call: the floor."
    )
    max_empty_tool_calls: int = Field(
        default=0,
        ge=0,
        description="Answers with an empty tool call or a streamed tool-call delta that carried nothing.",
    )
    max_stream_differences: int = Field(
        default=0, ge=0, description="Cases whose streamed answer differs from the whole one (greedy sampling)."
    )


class ConformanceConfig(StrictBlock):
    """The served API against the Kimi-K3 contract, between smoke and bench (DESIGN.md, conformance)."""

    _block_type_name = "k3deploy conformance"

    enabled: bool = Field(default=True, description="Run the conformance stage (off: the stage does not apply).")
    url: HttpUrl | None = Field(
        default=None, description="Ask through this URL (a gateway in front of the service); default node 0's port."
    )
    schemas: int = Field(
        default=120, ge=1, le=120, description="Corpus schemas sent as forced tool calls (the first N of 120)."
    )
    under_load: bool = Field(default=True, description="Send the whole suite a second time, at `concurrency`.")
    concurrency: int | None = Field(
        default=None, ge=2,
        description="Requests in flight in the load pass; default the bench's max_concurrency, and at least 8.",
    )  # fmt: skip
    strict_tools: bool = Field(
        default=False,
        description='Declare every tool with "strict": true (vLLM then pins the arguments\' schemas in its grammar).',
    )
    max_tokens: int = Field(default=2048, ge=16, description="max_tokens of every request (thinking comes first).")
    request_timeout_s: float = Field(default=300, gt=0, description="Each request must answer within this.")
    thresholds: ConformanceThresholds = Field(default_factory=ConformanceThresholds, description="Pass marks.")

    def in_flight(self, bench_concurrency: int) -> int:
        return self.concurrency or max(bench_concurrency, 8)
