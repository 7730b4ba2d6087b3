"""Runs killed with their worker: the server marks them Crashed and tells the alerts webhook.

A run whose worker host dies (SIGKILL, power, OOM) writes no record and sends no alert: its process is
gone, and Prefect shows it Running for ever. The deployments make their runs beat (Prefect's flow run
heartbeat, every HEARTBEAT_S); two server automations per cluster do the rest, as Prefect's guide to
zombie flows describes: a proactive one marks a run of the cluster's deployments Crashed after SILENT_S
without a beat or an end, and a reactive one POSTs the alert message (the fields of k3deploy's own
alert, verdict CRASHED) to a Webhook block holding the URL, which stays a secret on the server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from datetime import timedelta
from typing import cast
from uuid import UUID

from prefect import get_client
from prefect.blocks.webhook import Webhook
from prefect.client.schemas.objects import StateType
from prefect.events.actions import CallWebhook, ChangeFlowRunState
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.types import SecretDict
from pydantic import SecretStr

HEARTBEAT_S = 30  # PREFECT_FLOWS_HEARTBEAT_FREQUENCY in the deployments' environment: Prefect's least
SILENT_S = 90  # three beats missed: the run's process is gone
HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}
CRASH_MESSAGE = f"no heartbeat for {SILENT_S} s: the run's worker or host died with it (k3deploy crash watch)"


def _slug(cluster: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", cluster.lower()).strip("-") or "default"


def names(cluster: str) -> tuple[str, str, str]:
    """The zombie automation's, the alert automation's and the webhook block's names for a cluster."""
    slug = _slug(cluster)
    return f"k3deploy-crash-watch-{slug}", f"k3deploy-crash-alert-{slug}", f"k3deploy-alerts-{slug}"


def _of_deployments(ids: Iterable[UUID]) -> ResourceSpecification:
    return ResourceSpecification(
        {"prefect.resource.role": "deployment", "prefect.resource.id": [f"prefect.deployment.{i}" for i in ids]}
    )


def zombie_automation(cluster: str, deployment_ids: Iterable[UUID]) -> AutomationCore:
    """A run of these deployments silent for SILENT_S after a beat, with no end in between, is Crashed."""
    return AutomationCore(
        name=names(cluster)[0],
        description=f"k3deploy: a run on cluster {cluster} that stopped beating for {SILENT_S} s is Crashed.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.*"},  # another beat, or any state change (its end among them)
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=_of_deployments(deployment_ids),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=SILENT_S),
        ),
        actions=[ChangeFlowRunState(name="Crashed", state=StateType.CRASHED, message=CRASH_MESSAGE, force=False)],
    )


def crash_payload(cluster: str) -> str:
    """The alert's JSON as a template of the server's: the fields of k3deploy's own alert, verdict CRASHED."""
    name = json.dumps(cluster)
    return (
        "{"
        f'"text": {{{{ ("k3deploy: run " ~ flow_run.name ~ " on cluster " ~ {name} ~ ": CRASHED: " '
        '~ flow_run.state.message ~ ". Prefect: " ~ (flow_run|ui_url)) | tojson }}, '
        '"run_name": {{ flow_run.name | tojson }}, "run_id": "{{ flow_run.id }}", '
        f'"cluster": {name}, "verdict": "CRASHED", "failed_stage": null, "failure_class": "infrastructure", '
        '"cause": {{ flow_run.state.message | tojson }}, "report": null, '
        '"prefect_run": {{ (flow_run|ui_url) | tojson }}'
        "}"
    )


def alert_automation(cluster: str, deployment_ids: Iterable[UUID], webhook_block: UUID) -> AutomationCore:
    """A run of these deployments that crashed (marked by the watch above, or by its worker) is told."""
    return AutomationCore(
        name=names(cluster)[1],
        description=f"k3deploy: a crashed run on cluster {cluster} POSTs its alert to the alerts webhook.",
        trigger=EventTrigger(
            expect={"prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=_of_deployments(deployment_ids),
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[CallWebhook(block_document_id=webhook_block, payload=crash_payload(cluster))],
    )


def apply_crash_watch(
    cluster: str, watched: Iterable[UUID], alerted: Iterable[UUID], webhook_url: SecretStr | None
) -> list[str]:
    """Create or replace the cluster's automations (and its webhook block); the names of those now in force."""
    watch_name, alert_name, block_name = names(cluster)
    wanted = [zombie_automation(cluster, watched)]
    if webhook_url is not None:
        block = Webhook(url=webhook_url, headers=SecretDict({"Content-Type": "application/json"}))
        block_id = cast(UUID, block.save(block_name, overwrite=True))  # sync here: the id
        wanted.append(alert_automation(cluster, alerted, block_id))
    with get_client(sync_client=True) as client:
        for name in (watch_name, alert_name):
            for old in client.read_automations_by_name(name):
                client.delete_automation(old.id)
        for automation in wanted:
            client.create_automation(automation)
    return [a.name for a in wanted]
