"""Smoke-test settings: what the checks send and how long each request may take."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from k3deploy.blocks._types import StrictBlock


class SmokeConfig(StrictBlock):
    """Real requests against node 0 once the service is ready (seed section 6, as checks with verdicts)."""

    _block_type_name = "k3deploy smoke"

    request_timeout_s: float = Field(
        default=120, gt=0, description="Each request must answer within this; a dead DP rank's share never does."
    )
    burst_requests: int | None = Field(
        default=None, ge=1, description="Concurrent requests of the every-DP-rank check; default 4 per DP rank."
    )
    max_tokens: int = Field(default=32, ge=1, description="max_tokens of the chat, streaming and image checks.")
    reasoning_max_tokens: int = Field(
        default=1024, ge=1, description="max_tokens of the reasoning and tool-call checks (thinking comes first)."
    )
    vision: Literal["auto", "yes", "no"] = Field(
        default="auto",
        description="Does the served model take images: auto reads vision_config from its config.json on node 0.",
    )
