"""`k3deploy rerun RUN_ID`: the UI's Retry of a finished validate run, from the command line.

The same flow run runs again (run count 2, same parameters): stages that passed with the same
inputs are cache hits, the failed stage and what follows run. A run from a deployment goes back
to its work pool for a worker; a run started from the CLI executes here, as it did the first time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast
from uuid import UUID

from prefect import get_client
from prefect.client.orchestration import OrchestrationResult
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.client.schemas.responses import SetStateStatus
from prefect.flow_engine import run_flow
from prefect.states import Scheduled, State

from k3deploy.core.errors import K3DeployError
from k3deploy.records.record import read_record

FINISHED = {StateType.COMPLETED, StateType.FAILED, StateType.CANCELLED, StateType.CRASHED}


def find_run(run: str) -> FlowRun:
    """A validate flow run by its id or a unique prefix of a recorded run's id."""
    try:
        run_id = UUID(run)
    except ValueError:
        run_id = UUID(read_record(run).run_id)
    with get_client(sync_client=True) as client:
        try:
            flow_run = client.read_flow_run(run_id)
            flow = client.read_flow(flow_run.flow_id)
        except Exception as err:
            raise K3DeployError(f"no flow run {run_id} on the Prefect server: {err}") from None
    if flow.name != "validate":
        raise K3DeployError(f"run {run_id} is a {flow.name!r} run; rerun retries validate runs")
    return flow_run


def retry(run: str, on_state: Callable[[str], None] = lambda _s: None, poll_s: float = 2.0) -> State:
    """Schedule the finished run again and see it to its end (here, or by a worker of its pool)."""
    flow_run = find_run(run)
    if flow_run.state is None or flow_run.state.type not in FINISHED:
        now = flow_run.state.name if flow_run.state else "unknown"
        raise K3DeployError(f"run {flow_run.id} is {now}; only a finished run can be run again")
    with get_client(sync_client=True) as client:
        answer: OrchestrationResult[Any] = client.set_flow_run_state(
            flow_run.id, Scheduled(message="k3deploy rerun"), force=True
        )
        if answer.status == SetStateStatus.ABORT:
            why = getattr(answer.details, "reason", "no reason given")
            raise K3DeployError(f"Prefect refused to retry run {flow_run.id}: {why}")
        if flow_run.deployment_id is None:
            from k3deploy.flows.validate import validate

            again = client.read_flow_run(flow_run.id)
            ran = run_flow(validate, flow_run=again, parameters=again.parameters, return_type="state")
            return cast(State, ran)
        on_state(f"scheduled run {flow_run.id} again; waiting for a worker of its work pool")
        seen = None
        while True:
            current = client.read_flow_run(flow_run.id).state
            if current is not None and current.name != seen:
                seen = current.name
                on_state(f"run {flow_run.id}: {current.name}")
            if current is not None and current.type in FINISHED:
                return current
            time.sleep(poll_s)
