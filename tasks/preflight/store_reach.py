"""The fleet's shared store at a run's start: reachable, or what the run does without it (store.on_unreachable)."""

from __future__ import annotations

from typing import Literal

from k3deploy.blocks.store import SftpStore
from k3deploy.core.stage import FailureClass, Finding
from k3deploy.tasks.transport.sftp_store import reach

CHECK = "reachable"


def store_finding(store: SftpStore | None, on_unreachable: Literal["fail", "local"]) -> Finding | None:
    """A finding for the server's shared store (None: it has none). Unreachable fails the run before any stage that
    spends cluster time (`fail`), or goes on with this worker's results and a partial history (`local`)."""
    if store is None:
        return None
    subject = f"shared store {store.where()}"
    why = reach(store)
    if why is None:
        return Finding(subject, CHECK, True, "answers: stage results and runs are the fleet's")
    if on_unreachable == "fail":
        return Finding(subject, CHECK, False, f"{why}; no stage runs without it (store.on_unreachable: fail): the "
                       "stages that passed on another worker would run again, and the history would miss the other "
                       "workers' runs", cause=FailureClass.INFRASTRUCTURE)  # fmt: skip
    return Finding(subject, CHECK, True, f"{why}; going on with this worker's results and history "
                   "(store.on_unreachable: local): the history verdict is INCONCLUSIVE")  # fmt: skip
