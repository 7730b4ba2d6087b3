"""The server's side of a run that dies with its worker: two automations per cluster, saved by `k3deploy deploy`.

A flow run killed with its worker (SIGKILL, power lost, the OOM killer) never reaches its own alert. The server
knows it only by its silence: a deployment's run sends a heartbeat every `server.heartbeat_seconds`, and one that
has sent none for `server.silence_seconds()` (3 heartbeats plus the grace a run gives a missing server) is marked
Crashed (a proactive trigger, one per flow run). A Crashed run of the nightly deployment (of any of the cluster's
deployments with `alerts.every_run`) then sends the alert's JSON message, verdict CRASHED, through a Custom Webhook
block that holds the URL as a secret (a reactive trigger). A Crashed run's cluster hold is freed at once: a waiting
run takes over a hold whose holder's run is final (flows/cluster_hold.py).

Both match the cluster's deployments by id: a stage subflow beats too, but has no deployment, so a dead run is
marked and alerted once, never once per subflow.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from datetime import timedelta
from typing import cast
from uuid import UUID

from prefect import get_client
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState, SendNotification
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.exceptions import ObjectNotFound

from k3deploy.blocks.alerts import AlertsConfig
from k3deploy.blocks.fleet import ServerConfig
from k3deploy.flows.run_labels import HOST_LABEL, STAGE_LABEL, WORKER_LABEL

HEARTBEAT = "prefect.flow-run.heartbeat"
ENDED = ("Completed", "Failed", "Cancelled", "Crashed")  # a run that ended said so: no silence to judge
CRASHED = "prefect.flow-run.Crashed"
URL_SECRET = "webhook_url"  # the block's secret the URL is substituted from


def crash_marker_name(cluster: str) -> str:
    return f"k3deploy: mark silent runs Crashed ({cluster})"


def crash_alert_name(cluster: str) -> str:
    return f"k3deploy: alert crashed runs ({cluster})"


def webhook_block_name(cluster: str) -> str:
    """A block document's name: lower-case letters, digits and dashes."""
    return "k3deploy-crash-alert-" + "".join(c if c.isalnum() else "-" for c in cluster.lower())


def _of_deployments(deployment_ids: Iterable[UUID]) -> ResourceSpecification:
    ids = sorted(f"prefect.deployment.{d}" for d in deployment_ids)
    return ResourceSpecification({"prefect.resource.role": "deployment", "prefect.resource.id": ids})


def crash_marker(cluster: str, deployment_ids: Iterable[UUID], server: ServerConfig) -> AutomationCore:
    """A run of these deployments silent for `server.silence_seconds()` after a heartbeat is marked Crashed."""
    silence = server.silence_seconds()
    trigger = EventTrigger(
        after={HEARTBEAT},
        expect={HEARTBEAT, *(f"prefect.flow-run.{state}" for state in ENDED)},
        match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
        match_related=_of_deployments(deployment_ids),
        for_each={"prefect.resource.id"},
        posture=Posture.Proactive,
        threshold=1,
        within=timedelta(seconds=silence),
    )
    message = (
        f"no heartbeat for {silence} s (3 × server.heartbeat_seconds {server.heartbeat_seconds} + "
        f"server.grace_seconds {server.grace_seconds:g}): its process died with its worker or host"
    )
    return AutomationCore(
        name=crash_marker_name(cluster),
        description=f"k3deploy deploy: the runs of cluster {cluster}'s deployments whose heartbeats stopped.",
        trigger=trigger,
        actions=[ChangeFlowRunState(state=StateType.CRASHED, name="Crashed", message=message, force=False)],
    )


def alert_body(cluster: str, ui: str | None) -> str:
    """The alert's JSON message (records/alerts.py's fields, verdict CRASHED, the worker and host) as a template
    the server renders from the Crashed flow run; every value passes through `tojson`. The run's link is the
    server's own UI URL (its PREFECT_UI_URL), else the one `k3deploy deploy` was given (`ui`)."""
    name = json.dumps(cluster)
    base = json.dumps(f"{ui.rstrip('/')}/runs/flow-run/") if ui else "none"
    return (
        "{%- set labels = flow_run.labels or {} -%}"
        f'{{%- set stage = labels.get("{STAGE_LABEL}") -%}}'
        f'{{%- set worker = labels.get("{WORKER_LABEL}") -%}}'
        f'{{%- set host = labels.get("{HOST_LABEL}") -%}}'
        "{%- set cause = flow_run.state.message if flow_run.state else none -%}"
        "{%- set link = flow_run|ui_url -%}"
        f"{{%- set base = {base} -%}}"
        "{%- if not link and base %}{% set link = base ~ (flow_run.id|string) %}{% endif -%}"
        f'{{%- set text = "k3deploy: run " ~ flow_run.name ~ " on cluster " ~ {name} ~ ": CRASHED"'
        ' ~ (" at " ~ stage if stage else "") ~ " (worker " ~ (worker or "?") ~ ", host " ~ (host or "?") ~ ")"'
        ' ~ (": " ~ cause if cause else "") ~ ". No report: the run ended before writing one"'
        ' ~ (" (Prefect: " ~ link ~ ")" if link else "") -%}'
        '{"text": {{ text|tojson }}, "run_name": {{ flow_run.name|tojson }}, '
        '"run_id": {{ (flow_run.id|string)|tojson }}, '
        f'"cluster": {name}, "verdict": "CRASHED", "failed_stage": {{{{ stage|tojson }}}}, '
        '"failure_class": "infrastructure", "cause": {{ cause|tojson }}, "report": null, '
        '"prefect_run": {{ link|tojson }}, "worker": {{ worker|tojson }}, "host": {{ host|tojson }}}'
    )


def webhook_block(cluster: str, alerts: AlertsConfig) -> CustomWebhookNotificationBlock:
    """POSTs the rendered message as JSON to the alert's URL, kept in the block's secrets (never in its fields)."""
    assert alerts.webhook_url is not None
    return CustomWebhookNotificationBlock.model_validate(
        {
            "name": webhook_block_name(cluster),
            "url": "{{" + URL_SECRET + "}}",
            "form_data": "{{body}}",  # the body is the whole JSON document
            "headers": {"Content-Type": "application/json"},
            "timeout": alerts.timeout_s,
            "secrets": {URL_SECRET: alerts.webhook_url.get_secret_value()},
        }
    )


def crash_alert(cluster: str, deployment_ids: Iterable[UUID], block_id: UUID, ui: str | None) -> AutomationCore:
    """Each Crashed run of these deployments (marked by the server or by its worker) sends one message."""
    trigger = EventTrigger(
        expect={CRASHED},
        match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
        match_related=_of_deployments(deployment_ids),
        for_each={"prefect.resource.id"},
        posture=Posture.Reactive,
        threshold=1,
        within=timedelta(0),
    )
    notify = SendNotification(
        block_document_id=block_id,
        subject=f"k3deploy: a run on cluster {cluster} crashed",
        body=alert_body(cluster, ui),
    )
    return AutomationCore(
        name=crash_alert_name(cluster),
        description=f"k3deploy deploy: the crash alert of cluster {cluster}'s runs.",
        trigger=trigger,
        actions=[notify],
    )


def save(automation: AutomationCore) -> UUID:
    """Create it, or update the one of that name (a second deploy changes it, never doubles it)."""
    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(automation.name)
        if not found:
            return client.create_automation(automation)
        client.update_automation(found[0].id, automation)
        for extra in found[1:]:  # made by hand or by a race of two deploys: one is enough
            client.delete_automation(extra.id)
        return found[0].id


def remove(name: str) -> None:
    with get_client(sync_client=True) as client:
        for found in client.read_automations_by_name(name):
            client.delete_automation(found.id)


def apply_automations(
    cluster: str,
    server: ServerConfig,
    alerts: AlertsConfig,
    watched: Iterable[UUID],
    alerting: Iterable[UUID],
    ui: str | None,
) -> dict[str, UUID]:
    """The crash marker over `watched` deployments, and with a webhook the alert over `alerting`; name → id."""
    saved = {crash_marker_name(cluster): save(crash_marker(cluster, watched, server))}
    if alerts.webhook_url is None:  # alerts turned off since the last deploy: nor the URL kept on the server
        remove(crash_alert_name(cluster))
        with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
            block = client.read_block_document_by_name(webhook_block_name(cluster), "custom-webhook")
            client.delete_block_document(block.id)
        return saved
    block_id = cast(UUID, webhook_block(cluster, alerts).save(webhook_block_name(cluster), overwrite=True))
    saved[crash_alert_name(cluster)] = save(crash_alert(cluster, alerting, block_id, ui))
    return saved
