"""The container command sources the image's environment scripts first, as vLLM-Ascend's own harness does
(a container command reads no ~/.bashrc), and it is what `k3deploy plan` prints."""

from __future__ import annotations

import subprocess

import pytest

from k3deploy.blocks.loader import parse_config
from k3deploy.blocks.serve import SEED_SETUP
from k3deploy.tasks.render import entry_argv, render_plan
from tests.configs import site_data, with_changes

pytestmark = pytest.mark.launch


def test_the_seed_container_sources_cann_and_atb_then_runs_vllm_serve_unchanged():
    plan = render_plan(parse_config(site_data()))
    for node in plan.nodes:
        command = node.container.command
        assert command[:2] == ["bash", "-c"] and command[3] == "k3deploy-entry"
        assert command[2] == ". " + " && . ".join(SEED_SETUP) + ' && exec "$@"'
        assert command[4:] == node.serve_argv
    assert "k3deploy-entry vllm serve" in plan.to_text().replace("\\\n  ", "")


def test_without_setup_scripts_the_container_runs_vllm_serve_itself():
    plan = render_plan(parse_config(with_changes(site_data(), serve__container__setup_scripts=[])))
    assert plan.nodes[0].container.command == plan.nodes[0].serve_argv


def test_the_entry_really_sources_in_order_and_keeps_every_argument(tmp_path):
    first, second = tmp_path / "a env.sh", tmp_path / "b.sh"
    first.write_text("export A=from-a\nexport B=first\n")
    second.write_text('export B="$B-then-second"\n')
    argv = entry_argv(
        [str(first), str(second)], ["sh", "-c", 'printf "%s|%s|%s|%s" "$A" "$B" "$1" "$2"', "x", "a b", "$c"]
    )
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout == "from-a|first-then-second|a b|$c"
    missing = entry_argv([str(tmp_path / "none.sh")], ["echo", "ran"])
    assert subprocess.run(missing, capture_output=True, text=True).stdout == ""  # a missing script stops the start
