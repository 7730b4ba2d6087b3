"""models.local_hub: the hub the local profile runs for itself serves loopback only and is where hub_endpoint points."""

from __future__ import annotations

import pytest

from k3deploy.blocks import parse_config
from k3deploy.blocks.reference import config_reference
from k3deploy.core.errors import ConfigError
from tests.configs import site_data, with_changes

pytestmark = pytest.mark.config


def parsed(**changes):
    return parse_config(with_changes(site_data(), **changes), environ={})


def problems_of(**changes) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parsed(**changes)
    return dict(info.value.problems)


def test_no_local_hub_by_default_and_the_endpoint_stays_unset():
    models = parsed().models
    assert models.local_hub is None
    assert models.hub_endpoint is None


def test_defaults_serve_the_home_folder_on_loopback_and_set_the_endpoint(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    models = parsed(models__local_hub={}).models
    hub = models.local_hub
    assert hub is not None
    assert (hub.root, hub.host, hub.port, hub.generate) == (f"{tmp_path}/.k3deploy/hub", "127.0.0.1", 18080, {})
    assert models.hub_endpoint == "http://127.0.0.1:18080"


def test_endpoint_follows_host_and_port_and_generate_is_kept():
    models = parsed(
        models__local_hub={
            "root": "/srv/hub",
            "host": "127.0.0.2",
            "port": 19000,
            "generate": {"k3deploy/tiny-kimi-k3": "scripted", "k3deploy/tiny-kimi-k3-random": "random"},
        }
    ).models
    assert models.hub_endpoint == "http://127.0.0.2:19000"
    assert models.local_hub is not None and models.local_hub.root == "/srv/hub"
    assert models.local_hub.generate == {"k3deploy/tiny-kimi-k3": "scripted", "k3deploy/tiny-kimi-k3-random": "random"}


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:18080", "http://127.0.0.1:18080/"])
def test_an_endpoint_that_agrees_is_accepted(endpoint):
    assert parsed(models__local_hub={}, models__hub_endpoint=endpoint).models.hub_endpoint == endpoint


@pytest.mark.parametrize(
    "endpoint",
    ["http://127.0.0.1:18081", "http://127.0.0.2:18080", "https://127.0.0.1:18080", "http://127.0.0.1:18080/mirror",
     "https://huggingface.co"],
)  # fmt: skip
def test_an_endpoint_elsewhere_is_refused_naming_hub_endpoint(endpoint):
    problems = problems_of(models__local_hub={}, models__hub_endpoint=endpoint)
    assert set(problems) == {"models.hub_endpoint"}
    assert "http://127.0.0.1:18080" in problems["models.hub_endpoint"]
    assert "local_hub" in problems["models.hub_endpoint"]


@pytest.mark.parametrize(
    ("host", "words"),
    [
        ("0.0.0.0", "not a loopback address"),
        ("192.0.2.10", "not a loopback address"),
        ("localhost", "loopback IPv4 address such as 127.0.0.1"),
        ("::1", "loopback IPv4 address"),
        ("", "must not be empty"),
    ],
)
def test_only_a_loopback_host_is_accepted(host, words):
    problems = problems_of(models__local_hub={"host": host})
    assert "models.local_hub.host" in problems, problems
    assert words in problems["models.local_hub.host"]


@pytest.mark.parametrize(
    ("hub", "field", "words"),
    [
        ({"port": 0}, "models.local_hub.port", "greater than or equal to 1"),
        ({"port": 70000}, "models.local_hub.port", "less than or equal to 65535"),
        ({"root": "hub"}, "models.local_hub.root", "absolute path"),
        ({"root": "/srv/\nhub"}, "models.local_hub.root", "control character"),
        ({"generate": {"k3/tiny": "clever"}}, "models.local_hub.generate.k3/tiny", "'scripted' or 'random'"),
        ({"generate": {"../escape": "random"}}, "models.local_hub.generate.../escape", "is not a hub repository id"),
        ({"generate": {"a/b/c": "random"}}, "models.local_hub.generate.a/b/c", "is not a hub repository id"),
        ({"generat": {}}, "models.local_hub.generat", "unknown key"),
    ],
)  # fmt: skip
def test_bad_local_hub_values_name_the_field(hub, field, words):
    problems = problems_of(models__local_hub=hub)
    assert field in problems, problems
    assert words in problems[field]


def test_reference_lists_the_local_hub_keys():
    rows = [line for line in config_reference().splitlines() if "`models.local_hub" in line]
    assert [row.split("|")[1].strip() for row in rows] == [
        "`models.local_hub`",
        "`models.local_hub.root`",
        "`models.local_hub.host`",
        "`models.local_hub.port`",
        "`models.local_hub.generate`",
    ]
    assert all(row.split("|")[3].strip() for row in rows)  # every key says what it means
