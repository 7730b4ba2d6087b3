"""Values are checked for what they are when the config is loaded, naming the field: never only quoted and left
to fail on a node. Every field below reaches a command line, a label, a file name or a node."""

from __future__ import annotations

from typing import Any

import pytest

from k3deploy.blocks.loader import parse_config
from k3deploy.core.errors import ConfigError
from tests.configs import site_data, with_changes

pytestmark = pytest.mark.preflight

HOSTILE: list[tuple[str, Any, str]] = [
    ("cluster__nodes__0__address", "$(touch x)", "neither an IP address nor a host name"),
    ("cluster__nodes__0__address", "node 0.example.com", "neither an IP address nor a host name"),
    ("cluster__nodes__0__address", "-oProxyCommand=x", "neither an IP address nor a host name"),
    ("cluster__nodes__0__local_ip", "10.0.0.1; reboot", "is not an IP address"),
    ("cluster__nodes__0__local_ip", "node0.example.com", "is not an IP address"),
    ("cluster__nodes__0__nic", "eth 0", "is not a network interface name"),
    ("cluster__nodes__0__nic", "enp1s0f0-too-long-name", "is not a network interface name"),
    ("cluster__nodes__0__nic", "../x", "is not a network interface name"),
    ("cluster__nodes__0__name", "node;0", "is not a valid name"),
    ("cluster__nodes__0__name", "../node0", "is not a valid name"),
    ("image__ref", "quay.io/ascend/vllm ascend:a3", "is not an image reference"),
    ("image__ref", "quay.io/ascend/vllm-ascend:a3;rm -rf /", "is not an image reference"),
    ("image__ref", "Quay.io/Ascend/VLLM:a3", "is not an image reference"),  # repository path must be lower case
    ("serve__container__name", "vllm;reboot", "is not a valid name"),
    ("serve__container__network", "host net", "is not a valid name"),
    ("serve__container__mounts", ["/usr/local/dcmi"], None),  # a lone absolute path is a valid mount
    ("serve__container__mounts", ["usr/local/dcmi:/usr/local/dcmi"], "is not a mount spec"),
    ("serve__container__mounts", ["/usr/local/dcmi /usr/local/dcmi"], None),  # a path with a space is a path
    ("serve__container__mounts", ["/a:/b:rx"], "is not a mount spec"),
    ("serve__container__mounts", ["/a:/b:ro:z"], "is not a mount spec"),
    ("serve__container__devices", ["davinci0"], "is not a device spec"),
    ("serve__container__devices", ["/dev/davinci0:/dev/davinci0:rwx"], "is not a device spec"),
    ("models__target__repo", "Eco-Tech/Kimi K3", "is not a hub repository id"),
    ("models__target__repo", "Kimi-K3-w4a8", "is not a hub repository id"),
    ("models__target__repo", "a/b/c", "is not a hub repository id"),
    ("models__draft", {"repo": "Inferact/Kimi K3 DSpark"}, "is not a hub repository id"),
]


@pytest.mark.parametrize(("field", "value", "problem"), HOSTILE)
def test_a_value_is_checked_for_what_it_is_when_loaded(field, value, problem):
    data = with_changes(site_data(), **{field: value})
    if problem is None:
        parse_config(data)
        return
    with pytest.raises(ConfigError) as refused:
        parse_config(data)
    text = "\n".join(refused.value.lines)
    assert problem in text and field.split("__")[-1] in text, text  # the message names the field


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cluster__nodes__0__address", "node0.example.com"),
        ("cluster__nodes__0__address", "fe80::1"),
        ("cluster__nodes__0__local_ip", "192.0.2.77"),
        ("cluster__nodes__0__nic", "enp1s0f0np0"),
        ("cluster__nodes__0__nic", "bond0.100"),
        ("image__ref", "10.213.0.1:5000/k3deploy/testimg:1"),
        ("image__ref", "localhost/vllm-ascend"),
        ("serve__container__devices", ["/dev/davinci0:/dev/davinci0:rwm"]),
        ("models__target__repo", "vllm-ascend/Kimi-K3_w4a8.v2"),
    ],
)
def test_real_values_of_each_kind_are_accepted(field, value):
    parse_config(with_changes(site_data(), **{field: value}))
