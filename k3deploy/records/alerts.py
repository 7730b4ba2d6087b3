"""The alert a bad run sends: one JSON message with what a person on call acts on, and nothing secret.

The message is built from the run record (which holds no secret) and the regression verdict; the webhook's
URL, which may carry a token, is used to send and never said: a failed POST names its scheme and host only.
"""

from __future__ import annotations

from typing import Any

import httpx
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from k3deploy.blocks.alerts import AlertsConfig
from k3deploy.core.errors import AlertNotSent
from k3deploy.records.record import RunRecord

CAUSE_CHARS = 400  # the evidence a chat message shows; the report has the rest


def alert_verdict(record: RunRecord, regression: str | None) -> str:
    """FAIL (a stage failed), INCONCLUSIVE (cut short: its server went away), REGRESSED (the figures fell out of
    their history's spread), else PASS."""
    if record.verdict in ("fail", "inconclusive"):
        return record.verdict.upper()
    return "REGRESSED" if regression == "REGRESSED" else "PASS"


def alert_message(
    record: RunRecord, regression: str | None, cluster: str, report: str, run_url: str | None
) -> dict[str, Any]:
    """The webhook's JSON: a `text` line for chat tools, and the same facts as fields for machines."""
    verdict = alert_verdict(record, regression)
    cause = record.failure
    evidence = cause.describe() if cause else None
    if evidence and len(evidence) > CAUSE_CHARS:
        evidence = evidence[: CAUSE_CHARS - 1] + "…"
    name = record.run_name or record.run_id
    if verdict == "FAIL":
        what = f"FAIL at {record.failed_stage}"
    elif verdict == "REGRESSED":
        what = "REGRESSED"
    else:
        what = "PASS"
    text = f"k3deploy: run {name} on cluster {cluster}: {what}" + (f": {evidence}" if evidence else "")
    text += f". Report: {report}" + (f" (Prefect: {run_url})" if run_url else "")
    return {
        "text": text,
        "run_name": record.run_name,
        "run_id": record.run_id,
        "cluster": cluster,
        "verdict": verdict,
        "failed_stage": record.failed_stage,
        "failure_class": cause.failure_class.value if cause else None,
        "cause": evidence,
        "report": report,
        "prefect_run": run_url,
    }


def wanted(alerts: AlertsConfig, verdict: str, nightly: bool) -> bool:
    """A bad run of the nightly deployment (any run with every_run) alerts; a pass only when asked."""
    if alerts.webhook_url is None or not (nightly or alerts.every_run):
        return False
    return verdict != "PASS" or alerts.on_pass


@task(name="send alert", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def send_alert(alerts: AlertsConfig, message: dict[str, Any]) -> int:
    """POST the message; a webhook that refuses it is logged by host (never by URL) and fails only this task."""
    assert alerts.webhook_url is not None
    try:
        response = httpx.post(alerts.webhook_url.get_secret_value(), json=message, timeout=alerts.timeout_s)
    except httpx.HTTPError as err:
        raise AlertNotSent(f"alert to {alerts.target()} not sent: {type(err).__name__}") from None
    if response.status_code >= 300:
        raise AlertNotSent(f"alert to {alerts.target()} refused: HTTP {response.status_code}")
    get_run_logger().info("alert (%s) sent to %s", message["verdict"], alerts.target())
    return response.status_code
