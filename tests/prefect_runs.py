"""Reading back what a flow run did, from the Prefect server the tests run against."""

from __future__ import annotations

from typing import Any

from prefect import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.sorting import ArtifactSort


def task_states(flow_state: Any) -> dict[str, str]:
    """Task name (without Prefect's run suffix) → state name, e.g. {"verify checkpoint": "Cached"}."""
    flow_run_id = flow_state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {r.name.rsplit("-", 1)[0]: r.state.name for r in runs}


def latest_artifact(key: str) -> str:
    """The data of the newest artifact with this key (a markdown text, a table's JSON)."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    return str(found[0].data)
