"""What the server's crash alert says of a run that died: its host and the last stage it started, written as labels
on its flow run while it runs (the alert is rendered on the server from the flow run alone, after the run's own
process is gone; Prefect adds the worker's name itself).

The labels are sent from one daemon thread, in order: a stage never waits on the Prefect API for them, a server
that is away (flows/server_watch.py) costs at most a label, never the run, and a send still retrying never holds
the process at its exit.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

from prefect import get_client
from prefect.logging import get_logger

from k3deploy.flows.campaign import LISTENERS, Event

HOST_LABEL = "k3deploy.host"
STAGE_LABEL = "k3deploy.stage"
WORKER_LABEL = "prefect.worker.name"  # set by Prefect's worker on the runs it starts

Labels = dict[str, str | int | float | bool]


def _send(flow_run_id: UUID, labels: Labels) -> None:
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run_labels(flow_run_id, labels)  # merged with the run's other labels
    except Exception as err:  # a label is worth less than the run: noted, never raised
        get_logger("k3deploy.labels").debug("labels %s not written: %s", sorted(labels), err)


def _sender(flow_run_id: UUID, waiting: queue.Queue[Labels | None]) -> None:
    while (labels := waiting.get()) is not None:
        _send(flow_run_id, labels)


@contextmanager
def labelled_run(flow_run_id: UUID) -> Iterator[None]:
    """The run's host now, and each stage as it starts, on the run's flow run for the block's duration."""
    waiting: queue.Queue[Labels | None] = queue.Queue()
    threading.Thread(target=_sender, args=(flow_run_id, waiting), daemon=True, name="k3deploy-labels").start()

    def stage_started(event: Event) -> None:
        if event.kind == "stage" and not event.ended:
            waiting.put({STAGE_LABEL: event.name})

    waiting.put({HOST_LABEL: socket.gethostname()})
    LISTENERS.append(stage_started)
    try:
        yield
    finally:
        LISTENERS.remove(stage_started)
        waiting.put(None)  # the sender ends after what is queued; being a daemon, it never holds the exit
