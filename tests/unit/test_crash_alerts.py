"""The crash watch's automations and alert payload (pure): what the server is given to act on.

The payload is rendered by Prefect's own template environment with its own filters (as the server's
CallWebhook action renders it), against a server-side flow run object.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from uuid import uuid4

import pytest
from prefect.client.schemas.objects import StateType
from prefect.events.actions import CallWebhook, ChangeFlowRunState
from prefect.events.schemas.automations import Posture
from prefect.server.events.jinja_filters import all_filters
from prefect.server.schemas.core import FlowRun
from prefect.server.schemas.states import State
from prefect.server.utilities.user_templates import register_user_template_filters, render_user_template_sync

from k3deploy.alerts import alert_message
from k3deploy.deployments.crash_alerts import (
    HEARTBEAT_S,
    SILENT_S,
    alert_automation,
    crash_payload,
    names,
    zombie_automation,
)
from k3deploy.record import RunRecord

pytestmark = pytest.mark.prefect


def test_a_run_silent_for_three_beats_of_these_deployments_only_is_marked_crashed():
    ids = [uuid4(), uuid4()]
    automation = zombie_automation("site A", ids)
    trigger = automation.trigger
    assert automation.name == names("site A")[0] == "k3deploy-crash-watch-site-a"
    assert trigger.posture is Posture.Proactive and trigger.within == timedelta(seconds=SILENT_S)  # type: ignore[union-attr]
    assert SILENT_S == 3 * HEARTBEAT_S
    assert trigger.after == {"prefect.flow-run.heartbeat"} and trigger.expect == {"prefect.flow-run.*"}  # type: ignore[union-attr]
    related = trigger.match_related  # type: ignore[union-attr]
    assert related is not None and related.get("prefect.resource.id") == [f"prefect.deployment.{i}" for i in ids]
    (action,) = automation.actions
    assert isinstance(action, ChangeFlowRunState) and action.state is StateType.CRASHED


def test_the_crash_alert_carries_the_fields_of_k3deploys_own_alert_quoted_whatever_the_run_is_called():
    register_user_template_filters(all_filters)
    run = FlowRun(id=uuid4(), flow_id=uuid4(), name='night "of" <the> run',
                  state=State(type=StateType.CRASHED, message="no heartbeat for 90 s: the worker died"))  # fmt: skip
    rendered = json.loads(render_user_template_sync(crash_payload('fleet "a"'), {"flow_run": run}))
    own = alert_message(RunRecord.model_construct(run_id="r", run_name="n", verdict="fail", failed_stage=None,
                                                  failure=None), None, "c", "report.html", None)  # fmt: skip
    assert set(rendered) == set(own)
    assert rendered["run_name"] == 'night "of" <the> run' and rendered["run_id"] == str(run.id)
    assert rendered["cluster"] == 'fleet "a"' and rendered["verdict"] == "CRASHED"
    assert rendered["cause"] == "no heartbeat for 90 s: the worker died"
    assert rendered["failure_class"] == "infrastructure" and rendered["failed_stage"] is None
    assert rendered["text"].startswith('k3deploy: run night "of" <the> run on cluster fleet "a": CRASHED: no heartbeat')


def test_the_alert_automation_calls_the_webhook_block_on_a_crash_of_the_alerted_deployments():
    block, nightly = uuid4(), uuid4()
    automation = alert_automation("b", [nightly], block)
    assert automation.name == names("b")[1]
    assert automation.trigger.expect == {"prefect.flow-run.Crashed"}  # type: ignore[union-attr]
    assert automation.trigger.posture is Posture.Reactive  # type: ignore[union-attr]
    (action,) = automation.actions
    assert isinstance(action, CallWebhook) and action.block_document_id == block
    assert "webhook" not in action.payload.lower() and "http" not in action.payload  # the URL is only in the block


def test_every_deployment_runs_with_heartbeats_the_crash_watch_can_miss():
    from k3deploy.deployments.definitions import deployments

    local = Path(__file__).parents[2] / "configs" / "local.yaml"
    made = deployments(str(local))
    assert made and all(d.job_variables["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == str(HEARTBEAT_S) for d in made)
