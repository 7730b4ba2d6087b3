"""Whatever a config value holds, the pasted plan parses back to the same value, or it is refused."""

from __future__ import annotations

import re
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3deploy.blocks import parse_config
from k3deploy.core.errors import ConfigError
from k3deploy.tasks.render import render_plan
from tests.configs import site_data, with_changes

pytestmark = pytest.mark.config

BASE = site_data()
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
PLACEHOLDER = re.compile(r"<[A-Z0-9][A-Z0-9_]*>")
# Shell metacharacters and quotes are the interesting part; st.text() adds the rest of Unicode.
NASTY = st.text(alphabet=st.sampled_from(list(" '\"$`\\;&|<>(){}[]*?!~#=%\n\t-/aZ0")), max_size=24)
VALUES = st.one_of(NASTY, st.text(max_size=24))
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pasted_commands(plan) -> list[list[str]]:
    """Every command of the text plan as a shell would split it (continuations joined)."""
    text = plan.to_text().replace("\\\n", " ")
    return [shlex.split(line) for line in text.split("\n") if line and not line.startswith("#")]


def render_or_refuse(data, field: str | tuple[str, ...], value: str):
    """Render, or check the refusal is the documented one for this value and names the field."""
    try:
        return render_plan(parse_config(data))
    except ConfigError as err:
        fields = dict(err.problems)
        named = [f for f in ((field,) if isinstance(field, str) else field) if f in fields]
        assert named, err.problems
        reason = fields[named[0]]
        assert (
            (CONTROL.search(value) and "control character" in reason)
            or (PLACEHOLDER.search(value) and "placeholder" in reason)
            or (value.startswith("-") and "option" in reason)
            or (value == "" and "empty" in reason)
            or ("absolute path" in reason and not value.startswith("/"))
            or "already used" in reason
            or "neither an IP address nor a host name" in reason  # checked for what it is (test_hostile_values.py)
            or "is not a network interface name" in reason
            or "is not a valid name" in reason
            or "is not an image reference" in reason
        ), (value, reason)
        return None


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@SETTINGS
@given(VALUES)
def test_served_model_name(value):
    plan = render_or_refuse(with_changes(BASE, serve__served_model_name=value), "serve.served_model_name", value)
    if plan:
        for argv in (plan.nodes[0].serve_argv, plan.nodes[3].serve_argv, plan.bench_argv):
            assert argv in pasted_commands(plan)
        assert flag_value(plan.nodes[0].serve_argv, "--served-model-name") == value
        assert flag_value(plan.bench_argv, "--model") == value


@SETTINGS
@given(VALUES)
def test_model_root_and_paths(value):
    root = "/" + value
    data = with_changes(BASE, cluster__model_root=root)
    plan = render_or_refuse(data, "cluster.model_root", root)
    if plan:
        commands = pasted_commands(plan)
        node = plan.nodes[1]
        assert node.serve_argv in commands and node.container.docker_run_argv() in commands
        assert node.serve_argv[2] == f"{root.rstrip('/')}/Kimi-K3-w4a8"
        assert flag_value(node.container.docker_run_argv(), "-v").startswith("/usr/local/dcmi")
        assert f"{root}:{root}" in node.container.docker_run_argv()


@SETTINGS
@given(VALUES)
def test_node_address_and_nic(value):
    data = with_changes(BASE, cluster__nodes__0__address=value, cluster__nodes__2__nic=value)
    plan = render_or_refuse(data, ("cluster.nodes[0].address", "cluster.nodes[2].nic"), value)
    if plan:
        commands = pasted_commands(plan)
        assert flag_value(plan.nodes[3].serve_argv, "--data-parallel-address") == value
        assert plan.nodes[3].serve_argv in commands
        assert plan.bench_argv in commands
        assert flag_value(plan.bench_argv, "--base-url") == f"http://{value}:8000"
        assert f"NIC_NAME={value}" in plan.nodes[2].container.docker_run_argv()


@SETTINGS
@given(VALUES)
def test_environment_value(value):
    # $ introduces a ${NAME} reference in serve.env; $$ is a literal dollar sign.
    data = with_changes(BASE, serve__env={"SOME_SETTING": value.replace("$", "$$")})
    plan = render_or_refuse(data, "serve.env.SOME_SETTING", value)
    if plan:
        exported = {}
        for argv in pasted_commands(plan):
            if argv[0] == "export":
                key, _, val = argv[1].partition("=")
                exported[key] = val
        assert exported["SOME_SETTING"] == value
        assert plan.nodes[0].env["SOME_SETTING"] == value
        assert f"SOME_SETTING={value}" in plan.nodes[0].container.docker_run_argv()
        assert plan.nodes[0].container.docker_run_argv() in pasted_commands(plan)


@SETTINGS
@given(st.lists(VALUES, max_size=3))
def test_extra_args_each_stay_one_argument(values):
    data = with_changes(BASE, serve__extra_args=values, bench__extra_args=values)
    try:
        plan = render_plan(parse_config(data))
    except ConfigError as err:
        assert any(CONTROL.search(v) or PLACEHOLDER.search(v) for v in values), err.problems
        return
    if values:
        assert plan.nodes[0].serve_argv[-len(values) :] == values
        assert plan.bench_argv[-len(values) :] == values
    assert plan.nodes[0].serve_argv in pasted_commands(plan)
    assert plan.bench_argv in pasted_commands(plan)


@SETTINGS
@given(VALUES)
def test_container_name_and_image(value):
    data = with_changes(BASE, serve__container__name=value, image__ref=value)
    plan = render_or_refuse(data, ("serve.container.name", "image.ref"), value)
    if plan:
        argv = plan.nodes[0].container.docker_run_argv()
        assert flag_value(argv, "--name") == value
        assert argv[-len(plan.nodes[0].container.command) - 1].startswith(value)
        assert argv in pasted_commands(plan)
