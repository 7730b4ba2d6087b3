"""The configuration Blocks against a real (ephemeral) Prefect server: save, load, secrets kept."""

from __future__ import annotations

import pytest

from k3deploy.blocks import DeploymentConfig, parse_config
from k3deploy.tasks.render import render_plan
from tests.configs import site_data

pytestmark = pytest.mark.prefect


def test_deployment_block_round_trips_with_secrets(prefect_server):
    cfg = parse_config(site_data(), environ={"K3DEPLOY_HUB_TOKEN": "hf_block_sekrit"})
    cfg.save("site-a", overwrite=True)
    loaded = DeploymentConfig.load("site-a")
    assert loaded.models.hub_token.get_secret_value() == "hf_block_sekrit"
    assert render_plan(loaded).to_json() == render_plan(cfg).to_json()
    assert "hf_block_sekrit" not in repr(loaded)
