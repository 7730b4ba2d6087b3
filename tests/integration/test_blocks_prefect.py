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


def test_a_flow_takes_a_saved_block_by_name_and_an_unknown_name_is_a_clear_error(prefect_server):
    from k3deploy.blocks.source import resolve_config
    from k3deploy.errors import ConfigError

    cfg = parse_config(site_data(), environ={})
    cfg.save("site-b", overwrite=True)
    assert resolve_config("site-b").fingerprint() == cfg.fingerprint()
    assert resolve_config(cfg) is cfg
    with pytest.raises(ConfigError, match="no-such-site: no such YAML file, and no saved DeploymentConfig block"):
        resolve_config("no-such-site")
