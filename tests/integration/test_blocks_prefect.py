"""The configuration Blocks against a real (ephemeral) Prefect server: save, load, secrets kept."""

from __future__ import annotations

import pytest

from k3deploy.blocks import DeploymentConfig, parse_config
from k3deploy.tasks.render import render_plan
from tests.configs import site_data

pytestmark = [pytest.mark.prefect, pytest.mark.anywhere]


def test_deployment_block_round_trips_with_secrets(prefect_server):
    cfg = parse_config(site_data(), environ={"K3DEPLOY_HUB_TOKEN": "hf_block_sekrit"})
    cfg.save("site-a", overwrite=True)
    loaded = DeploymentConfig.load("site-a")
    assert loaded.models.hub_token.get_secret_value() == "hf_block_sekrit"
    assert render_plan(loaded).to_json() == render_plan(cfg).to_json()
    assert "hf_block_sekrit" not in repr(loaded)


def test_a_flow_takes_a_saved_block_by_name_and_an_unknown_name_is_a_clear_error(prefect_server):
    from k3deploy.blocks.source import resolve_config
    from k3deploy.core.errors import ConfigError

    cfg = parse_config(site_data(), environ={})
    cfg.save("site-b", overwrite=True)
    assert resolve_config("site-b").fingerprint() == cfg.fingerprint()
    assert resolve_config(cfg) is cfg
    with pytest.raises(ConfigError, match="no-such-site: no such YAML file, and no saved DeploymentConfig block"):
        resolve_config("no-such-site")


@pytest.mark.cli
@pytest.mark.parametrize("kept", [True, False])
def test_a_config_block_keeping_the_ssh_key_on_the_server_is_warned_about(prefect_server, kept, tmp_path):
    """The server serves a block's secrets to whoever holds its auth string: a key kept there is named."""
    import os
    import subprocess
    import sys

    from prefect.settings import PREFECT_API_URL

    data = site_data()
    data["cluster"]["ssh"] = {"private_key_file": "/etc/k3deploy/id_ed25519"}
    environ = {"K3DEPLOY_SSH_PRIVATE_KEY": "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n"} if kept else {}
    name = f"site-key-{kept}".lower()
    parse_config(data, environ=environ).save(name, overwrite=True)
    env = os.environ | {"PREFECT_API_URL": str(PREFECT_API_URL.value()), "K3DEPLOY_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "k3deploy", "plan", "-c", name], capture_output=True, text=True,
                          env=env, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    warned = f"warning: the DeploymentConfig block {name} keeps the nodes' SSH private key on" in done.stderr
    assert warned is kept, done.stderr
    assert "PRIVATE KEY" not in done.stdout + done.stderr
