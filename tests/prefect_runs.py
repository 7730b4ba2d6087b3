"""Reading back what a flow run did, from the Prefect server the tests run against."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import ArtifactSort
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings


def task_states(flow_state: Any, within_s: float = 60) -> dict[str, str]:
    """Task name (without Prefect's run suffix) → final state name, e.g. {"verify checkpoint": "Cached"}.

    The server records task run states from events, after the flow has returned: a task may still read
    Running for a moment, so this waits (bounded) until every task run of the flow has a final state.
    """
    flow_run_id = flow_state.state_details.flow_run_id
    deadline = time.monotonic() + within_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if all(r.state is not None and r.state.is_final() for r in runs):
                return {r.name.rsplit("-", 1)[0]: r.state.name for r in runs if r.state is not None}
            pending = [r.name for r in runs if r.state is None or not r.state.is_final()]
            assert time.monotonic() < deadline, f"task runs without a final state after {within_s} s: {pending}"
            time.sleep(0.2)  # polling the server's record, not a wait for the machine


def latest_artifact(key: str) -> str:
    """The data of the newest artifact with this key (a markdown text, a table's JSON)."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    return str(found[0].data)


FINISHED = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 240) -> Any:
    """Poll an observable condition until it holds; fail naming it at the deadline (every wait has one)."""
    deadline = time.monotonic() + timeout
    while not (got := probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)
    return got


def flow_run(run_id: UUID) -> FlowRun:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def finished(run_id: UUID, timeout: float = 300) -> FlowRun:
    """The run once it is in a final state (failing the test after `timeout` seconds)."""
    return wait_for(
        f"run {run_id} to finish", lambda: (r := flow_run(run_id)).state.type.value in FINISHED and r, timeout
    )


def run_logs(run_id: UUID) -> list[str]:
    """The messages a flow run sent to the server (what its page in the UI shows), oldest first."""
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return [log.message for log in sorted(logs, key=lambda log: log.timestamp)]


def logged(run_id: UUID, text: str, timeout: float = 120) -> str:
    """The first log message of the run containing `text`, once the server has it."""
    return wait_for(
        f"run {run_id} to log {text!r}", lambda: next((m for m in run_logs(run_id) if text in m), None), timeout
    )


@contextmanager
def api_at(url: str, auth_string: str | None = None) -> Iterator[None]:
    """This process's Prefect client pointed at another server (a fleet's, the UI test's) for a block, with
    the server's auth string when it asks for one.

    Prefect keeps one events worker (and one log worker) per process, keyed by client type, not by URL: one
    first started here would send every later test's task run events to this server after it is gone, and
    their task runs would never reach the session's server. Both are drained and stopped on the way in and
    on the way out, while each server is up, so each gets only its own."""

    def drain() -> None:
        EventsWorker.drain_all(timeout=30)
        APILogWorker.drain_all(timeout=30)

    drain()
    with temporary_settings({PREFECT_API_URL: url, PREFECT_API_AUTH_STRING: auth_string}):
        try:
            yield
        finally:
            drain()
