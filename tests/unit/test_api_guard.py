"""Whether a Prefect API may be used as configured: loopback, or an auth string, or --insecure said."""

from __future__ import annotations

import pytest
from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_KEY, temporary_settings

from k3deploy.cli import server

pytestmark = [pytest.mark.cli, pytest.mark.prefect]


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:4200/api", "http://localhost:4200/api", "http://LOCALHOST.:4200/api", "http://127.8.9.1/api",
     "http://[::1]:4200/api", "https://127.0.0.1/api"],
)  # fmt: skip
def test_loopback_addresses_are_this_machine(url):
    assert server.on_loopback(url)
    assert server.exposure(url, authenticated=False) is None


@pytest.mark.parametrize(
    "url",
    ["http://10.213.0.1:4200/api", "http://0.0.0.0:4200/api", "http://prefect.example:4200/api",
     "http://localhost.example.com/api", "http://127.0.0.1.nip.io/api", "https://[2001:db8::1]/api",
     "http://192.168.1.5/api"],
)  # fmt: skip
def test_anything_else_needs_an_auth_string(url):
    assert not server.on_loopback(url)
    reason = server.exposure(url, authenticated=False)
    assert reason is not None and "\n" not in reason
    assert url in reason and "PREFECT_API_AUTH_STRING" in reason and "--insecure" in reason
    assert server.exposure(url, authenticated=True) is None


@pytest.fixture
def no_insecure(monkeypatch):
    monkeypatch.delenv(server.INSECURE_ENV, raising=False)


def test_a_remote_api_without_credentials_is_refused(no_insecure):
    warnings: list[str] = []
    with temporary_settings({PREFECT_API_AUTH_STRING: None, PREFECT_API_KEY: None}), pytest.raises(server.InsecureAPI):
        server.checked_api("http://10.213.0.1:4200/api", warnings.append)
    assert warnings == []


@pytest.mark.parametrize("setting", [PREFECT_API_AUTH_STRING, PREFECT_API_KEY])
def test_credentials_let_a_remote_api_through_quietly(no_insecure, setting):
    warnings: list[str] = []
    others = {PREFECT_API_AUTH_STRING: None, PREFECT_API_KEY: None}
    with temporary_settings({**others, setting: "s3cret"}):
        assert server.checked_api("http://10.213.0.1:4200/api", warnings.append) == "http://10.213.0.1:4200/api"
    assert warnings == []


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_insecure_lets_it_through_with_a_warning_each_time(monkeypatch, value):
    monkeypatch.setenv(server.INSECURE_ENV, value)
    warnings: list[str] = []
    with temporary_settings({PREFECT_API_AUTH_STRING: None, PREFECT_API_KEY: None}):
        for _ in range(2):
            server.checked_api("http://10.213.0.1:4200/api", warnings.append)
    assert len(warnings) == 2 and all("--insecure" in w and "10.213.0.1" in w for w in warnings)


@pytest.mark.parametrize("value", ["", "0", "no", "false"])
def test_insecure_is_only_an_explicit_yes(monkeypatch, value):
    monkeypatch.setenv(server.INSECURE_ENV, value)
    with temporary_settings({PREFECT_API_AUTH_STRING: None, PREFECT_API_KEY: None}), pytest.raises(server.InsecureAPI):
        server.checked_api("http://10.213.0.1:4200/api", lambda _: None)


def test_a_server_off_loopback_without_auth_is_refused_before_it_starts(no_insecure, tmp_path, monkeypatch):
    monkeypatch.setenv("K3DEPLOY_HOME", str(tmp_path))
    said: list[str] = []
    with pytest.raises(server.InsecureAPI, match="add --auth"):
        server.start(said.append, host="0.0.0.0", port=0)
    assert said == [] and not (tmp_path / "prefect-server.json").exists()


def test_the_auth_string_file_is_made_once_for_its_owner_only(tmp_path):
    path = tmp_path / server.AUTH_FILE
    first = server._auth_string(path)
    assert len(first) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert server._auth_string(path) == first
    path.chmod(0o644)
    with pytest.raises(server.ServerError, match="others may read it"):
        server._auth_string(path)
