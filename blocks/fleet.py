"""What a run does when the fleet's services are away: its Prefect server, its shared store."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from k3deploy.blocks._types import StrictBlock


class ServerConfig(StrictBlock):
    """How long a run goes on without its Prefect server before it ends on its own, INCONCLUSIVE; how soon the
    server calls a run whose process died Crashed (the deployments' automations, `k3deploy deploy`)."""

    _block_type_name = "k3deploy server"

    grace_seconds: float = Field(
        default=120, ge=10, le=3600,
        description="A run whose Prefect server does not answer goes on (its states and logs retried) for this many "
        "seconds; past them it ends INCONCLUSIVE naming the server, tears down what it started and writes its "
        "record to the runs folder, without the server.",
    )  # fmt: skip
    heartbeat_seconds: int = Field(
        default=30, ge=30, le=600,
        description="How often a deployment's flow run tells the server it is alive (Prefect's flow-run heartbeat; "
        "30 is Prefect's shortest). The server marks a run Crashed, and sends the crash alert, once it has been "
        "silent for 3 heartbeats plus grace_seconds: a run that only lost its server is never called dead.",
    )  # fmt: skip

    def silence_seconds(self) -> int:
        """How long a deployment's run may go without a heartbeat before the server calls it Crashed."""
        return 3 * self.heartbeat_seconds + int(self.grace_seconds)


class StoreConfig(StrictBlock):
    """What a run does when the server's shared store (`k3deploy store set`) cannot be reached at its start."""

    _block_type_name = "k3deploy store policy"

    on_unreachable: Literal["fail", "local"] = Field(
        default="fail",
        description="fail: stop before any stage runs, naming the store (no cluster time is spent on stages that "
        "may have passed on another worker). local: go on with this worker's results and history; the run's "
        "history verdict is then INCONCLUSIVE, and the run reaches the store with a later run.",
    )  # fmt: skip
