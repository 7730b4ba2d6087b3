"""The crash automations `k3deploy deploy` saves: what they match, how long a run may be silent, and the alert's
message as the server renders it (Prefect's own template engine and filters, on the server's FlowRun schema)."""

from __future__ import annotations

import json
from datetime import timedelta
from uuid import uuid4

import pytest
from prefect.server.events.jinja_filters import all_filters
from prefect.server.schemas.core import FlowRun
from prefect.server.schemas.states import State, StateType
from prefect.server.utilities.user_templates import register_user_template_filters, render_user_template_sync
from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings
from pydantic import SecretStr, ValidationError

from k3deploy.blocks.alerts import AlertsConfig
from k3deploy.blocks.fleet import ServerConfig
from k3deploy.deployments.automations import (
    alert_body,
    crash_alert,
    crash_marker,
    webhook_block,
    webhook_block_name,
)

pytestmark = [pytest.mark.prefect]
HOOK = "https://chat.example.com/hooks/T0KEN-secret"


def rendered(cluster: str, flow_run: FlowRun, ui: str | None = None) -> dict[str, object]:
    register_user_template_filters(all_filters)  # as the server's actions do before rendering
    return json.loads(render_user_template_sync(alert_body(cluster, ui), {"flow_run": flow_run}))


def dead_run(labels: dict[str, str] | None) -> FlowRun:
    state = State(type=StateType.CRASHED, name="Crashed", message='no heartbeat for 100 s: "quoted" \\ and\nnewline')
    return FlowRun(id=uuid4(), name="brave-otter", flow_id=uuid4(), labels=labels, state=state)


def test_a_silent_run_is_crashed_after_three_heartbeats_and_the_grace_and_only_the_clusters_deployments_count():
    deployments = [uuid4(), uuid4()]
    marker = crash_marker("lab-a", deployments, ServerConfig(grace_seconds=10, heartbeat_seconds=30))
    trigger = marker.trigger
    assert trigger.within == timedelta(seconds=100) and trigger.posture == "Proactive"
    assert trigger.after == {"prefect.flow-run.heartbeat"} and "prefect.flow-run.Completed" in trigger.expect
    assert trigger.for_each == {"prefect.resource.id"}  # one judgement per flow run
    related = trigger.match_related
    assert not isinstance(related, list)
    assert sorted(related["prefect.resource.id"]) == sorted(f"prefect.deployment.{d}" for d in deployments)
    (action,) = marker.actions
    assert action.type == "change-flow-run-state" and action.state.value == "CRASHED"
    assert action.message is not None and "100 s" in action.message and "grace_seconds 10" in action.message
    assert ServerConfig().silence_seconds() == 3 * 30 + 120  # the defaults: a run that lost its server is not dead


def test_the_heartbeat_cannot_be_set_below_prefects_shortest():
    with pytest.raises(ValidationError, match="heartbeat_seconds"):
        ServerConfig(heartbeat_seconds=10)


def test_the_alert_renders_the_alert_json_with_the_stage_worker_and_host_and_escapes_every_value():
    labels = {"k3deploy.stage": "bench", "k3deploy.host": "gpu-07", "prefect.worker.name": "worker-a"}
    with temporary_settings({PREFECT_UI_URL: "http://prefect.lab:4200"}):  # the server's own, first
        run = dead_run(labels)
        message = rendered('lab "a"', run, ui="http://deployed-from:4200")
    assert message["verdict"] == "CRASHED" and message["cluster"] == 'lab "a"'
    assert (message["failed_stage"], message["worker"], message["host"]) == ("bench", "worker-a", "gpu-07")
    assert message["run_id"] == str(run.id) and message["run_name"] == "brave-otter"
    assert message["cause"] == 'no heartbeat for 100 s: "quoted" \\ and\nnewline'
    assert message["prefect_run"] == f"http://prefect.lab:4200/runs/flow-run/{run.id}"
    assert message["report"] is None and message["failure_class"] == "infrastructure"
    assert str(message["text"]).startswith(
        'k3deploy: run brave-otter on cluster lab "a": CRASHED at bench (worker worker-a, host gpu-07): no heartbeat'
    )


def test_a_run_that_died_before_its_first_label_is_alerted_with_what_is_known():
    run = dead_run(None)
    with temporary_settings(restore_defaults={PREFECT_UI_URL, PREFECT_API_URL}):  # a server that knows no UI URL
        message = rendered("lab-a", run, ui="http://prefect.lab:4200/")
        assert rendered("lab-a", run)["prefect_run"] is None
    assert message["failed_stage"] is None and message["worker"] is None and message["host"] is None
    assert "CRASHED (worker ?, host ?)" in str(message["text"])
    assert message["prefect_run"] == f"http://prefect.lab:4200/runs/flow-run/{run.id}"  # the deploying client's


def test_the_webhook_block_keeps_the_url_among_its_secrets_and_sends_the_message_as_json():
    alerts = AlertsConfig(webhook_url=SecretStr(HOOK), timeout_s=7)
    block = webhook_block("lab-a", alerts)
    assert HOOK not in block.model_dump_json() and "T0KEN" not in repr(block)
    args = block._build_request_args(body='{"verdict": "CRASHED"}', subject="s")
    assert args["url"] == HOOK and args["content"] == '{"verdict": "CRASHED"}' and args["timeout"] == 7
    assert args["headers"] == {"Content-Type": "application/json"}
    assert webhook_block_name("Lab_A.1") == "k3deploy-crash-alert-lab-a-1"


def test_the_alert_fires_on_each_crashed_run_of_the_given_deployments_once():
    nightly, block = uuid4(), uuid4()
    alert = crash_alert("lab-a", [nightly], block, None)
    assert alert.trigger.expect == {"prefect.flow-run.Crashed"} and alert.trigger.posture == "Reactive"
    assert alert.trigger.threshold == 1 and alert.trigger.for_each == {"prefect.resource.id"}
    related = alert.trigger.match_related
    assert not isinstance(related, list) and related["prefect.resource.id"] == [f"prefect.deployment.{nightly}"]
    (action,) = alert.actions
    assert action.type == "send-notification" and action.block_document_id == block
