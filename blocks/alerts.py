"""Who hears of a bad nightly run: a webhook that is POSTed one JSON message per failed or REGRESSED run."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from k3deploy.blocks._types import StrictBlock


class AlertsConfig(StrictBlock):
    """Alerts of the nightly deployment's runs; the URL may carry a token, so it is a secret."""

    _block_type_name = "k3deploy alerts"

    webhook_url: SecretStr | None = Field(
        default=None,
        description="http(s) URL POSTed one JSON message (text and fields) per failed or REGRESSED run; "
        "none: no alerts; or set K3DEPLOY_ALERT_WEBHOOK. Secret (a chat tool's URL holds its token): never "
        "in a message, log or record.",
    )
    on_pass: bool = Field(default=False, description="Also send a message for a run that passed.")
    every_run: bool = Field(
        default=False,
        description="Alert on every run (the CLI's, the validate form's); default: the nightly deployment's only.",
    )
    timeout_s: float = Field(default=10.0, gt=0, le=120, description="How long one POST may take.")

    @field_validator("webhook_url")
    @classmethod
    def _http_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # the value itself is not repeated: it may hold a token
            raise ValueError(f"must be an http:// or https:// URL with a host (got scheme {parts.scheme!r})")
        return value

    def target(self) -> str:
        """Where alerts go, fit for a log line: scheme and host only."""
        if self.webhook_url is None:
            return "nowhere"
        parts = urlsplit(self.webhook_url.get_secret_value())
        return f"{parts.scheme}://{parts.hostname}"
