"""What the server's crash alert says of a run that died: its host and the last stage it started, written as labels
on its flow run while it runs (the alert is rendered on the server from the flow run alone, after the run's own
process is gone; Prefect adds the worker's name itself).

The labels are sent from one background thread, in order: a stage never waits on the Prefect API for them, and a
server that is away (flows/server_watch.py) costs at most a label, never the run.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from uuid import UUID

from prefect import get_client
from prefect.logging import get_logger

from k3deploy.flows.campaign import LISTENERS, Event

HOST_LABEL = "k3deploy.host"
STAGE_LABEL = "k3deploy.stage"
WORKER_LABEL = "prefect.worker.name"  # set by Prefect's worker on the runs it starts


def _send(flow_run_id: UUID, labels: dict[str, str | int | float | bool]) -> None:
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run_labels(flow_run_id, labels)  # merged with the run's other labels
    except Exception as err:  # a label is worth less than the run: noted, never raised
        get_logger("k3deploy.labels").debug("labels %s not written: %s", sorted(labels), err)


@contextmanager
def labelled_run(flow_run_id: UUID) -> Iterator[None]:
    """The run's host now, and each stage as it starts, on the run's flow run for the block's duration."""
    sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k3deploy-labels")

    def stage_started(event: Event) -> None:
        if event.kind == "stage" and not event.ended:
            sender.submit(_send, flow_run_id, {STAGE_LABEL: event.name})

    sender.submit(_send, flow_run_id, {HOST_LABEL: socket.gethostname()})
    LISTENERS.append(stage_started)
    try:
        yield
    finally:
        LISTENERS.remove(stage_started)
        sender.shutdown(wait=False)
