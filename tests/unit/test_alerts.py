"""The alert a bad run sends: its fields, what never goes in it, and which runs send one."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from k3deploy.blocks.alerts import AlertsConfig
from k3deploy.core.stage import FailureCause
from k3deploy.records.alerts import alert_message, alert_verdict, wanted
from k3deploy.records.record import RunRecord

pytestmark = pytest.mark.report
HISTORY = Path(__file__).parents[1] / "data" / "history" / "local-cpu"
PASSED = RunRecord.model_validate_json(next(iter(sorted(HISTORY.glob("*unchanged*.json")))).read_text())
TOKEN = "T0KEN-xyz"
HOOK = AlertsConfig(webhook_url=SecretStr(f"https://hooks.example.com/services/{TOKEN}"))


def failed(evidence: str = "local0 (DP rank 0): the process exited (status 1) during launch") -> RunRecord:
    cause = FailureCause(failure_class="engine", evidence=evidence, node="local0", dp_rank=0)
    return PASSED.model_copy(update={"verdict": "fail", "failed_stage": "launch", "failure": cause})


def test_a_failed_run_names_run_cluster_verdict_stage_class_and_the_report():
    message = alert_message(failed(), None, "lab-a", "/runs/r/report.html", "http://prefect:4200/runs/flow-run/r")
    assert message["verdict"] == "FAIL" and message["failed_stage"] == "launch"
    assert message["failure_class"] == "engine" and message["cluster"] == "lab-a"
    assert message["run_id"] == PASSED.run_id and message["report"] == "/runs/r/report.html"
    assert message["text"].startswith(f"k3deploy: run {PASSED.run_name} on cluster lab-a: FAIL at launch: engine: ")
    assert "local0 (DP rank 0)" in message["text"] and "http://prefect:4200/runs/flow-run/r" in message["text"]


def test_a_regressed_run_says_so_and_a_passing_run_alerts_only_when_asked():
    assert alert_message(PASSED, "REGRESSED", "lab-a", "r.html", None)["verdict"] == "REGRESSED"
    assert alert_verdict(PASSED, "PASS") == "PASS" and alert_verdict(failed(), "REGRESSED") == "FAIL"
    assert wanted(HOOK, "FAIL", nightly=True) and wanted(HOOK, "REGRESSED", nightly=True)
    assert not wanted(HOOK, "PASS", nightly=True)
    assert wanted(HOOK.model_copy(update={"on_pass": True}), "PASS", nightly=True)


def test_only_the_nightly_deployments_runs_alert_unless_every_run_and_none_without_a_webhook():
    assert not wanted(HOOK, "FAIL", nightly=False)
    assert wanted(HOOK.model_copy(update={"every_run": True}), "FAIL", nightly=False)
    assert not wanted(AlertsConfig(), "FAIL", nightly=True)


def test_long_evidence_is_cut_and_the_webhooks_token_is_never_in_a_message_or_the_target():
    message = alert_message(failed("x" * 5000), None, "lab-a", "r.html", None)
    assert len(message["cause"]) == 400 and message["cause"].endswith("…")
    assert TOKEN not in str(message) and HOOK.target() == "https://hooks.example.com"
    assert TOKEN not in repr(HOOK) and TOKEN not in HOOK.model_dump_json()


@pytest.mark.parametrize("url", ["ftp://hooks.example.com/x", "hooks.example.com/x", "https:///no-host"])
def test_a_webhook_that_is_not_an_http_url_is_refused_at_load_without_repeating_it(url):
    with pytest.raises(ValidationError) as caught:
        AlertsConfig(webhook_url=SecretStr(url))
    assert "http:// or https:// URL" in str(caught.value) and url not in str(caught.value)


def test_the_webhook_comes_from_the_environment_without_an_alerts_section_and_no_record_keeps_it():
    from k3deploy.blocks import parse_config
    from tests.configs import site_data

    url = f"https://hooks.example.com/services/{TOKEN}"
    cfg = parse_config(site_data(), environ={"K3DEPLOY_ALERT_WEBHOOK": url})
    assert cfg.alerts.webhook_url is not None and cfg.alerts.webhook_url.get_secret_value() == url
    assert cfg.public()["alerts"]["webhook_url"] is None and TOKEN not in str(cfg.public())


def test_a_bad_webhook_from_the_environment_is_a_config_error_naming_the_field_not_the_value():
    from k3deploy.blocks import parse_config
    from k3deploy.core.errors import ConfigError
    from tests.configs import site_data

    with pytest.raises(ConfigError) as caught:
        parse_config(site_data(), environ={"K3DEPLOY_ALERT_WEBHOOK": f"hooks.example.com/{TOKEN}"})
    assert "alerts.webhook_url" in str(caught.value) and TOKEN not in str(caught.value)
