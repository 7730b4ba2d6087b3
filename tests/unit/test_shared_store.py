"""The shared store's checks that need no host: its URL, the pinned key's form, paths kept inside the store."""

from __future__ import annotations

import json
from pathlib import Path

import paramiko
import pytest
from pydantic import SecretStr, ValidationError

from k3deploy.blocks.ssh_keys import parse_host_key
from k3deploy.blocks.store import SftpStore, StoreError
from k3deploy.cli.store import store_from
from k3deploy.core.errors import K3DeployError


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path, str]:
    """A private key file and a known_hosts naming 192.0.2.7:2222 with a real (ECDSA) public key."""
    private = paramiko.ECDSAKey.generate()
    key_file = tmp_path / "id"
    private.write_private_key_file(str(key_file))
    host_key = f"{private.get_name()} {private.get_base64()}"
    known = tmp_path / "known_hosts"
    known.write_text(f"[192.0.2.7]:2222 {host_key}\n")
    return key_file, known, host_key


def test_a_url_names_user_host_port_and_an_absolute_folder(keys):
    key_file, known, host_key = keys
    store = store_from("sftp://k3d@192.0.2.7:2222/srv/store/", key_file, known)
    assert (store.user, store.host, store.port, store.path, store.host_key) == ("k3d", "192.0.2.7", 2222,
                                                                                "/srv/store", host_key)  # fmt: skip
    assert store.where() == "sftp://k3d@192.0.2.7:2222/srv/store"


def test_the_server_keeps_the_key_s_path_unless_told_to_keep_the_key(keys, monkeypatch):
    key_file, known, _ = keys
    monkeypatch.chdir(key_file.parent)
    by_path = store_from("sftp://k3d@192.0.2.7:2222/srv", Path(key_file.name), known)
    assert by_path.private_key is None and by_path.private_key_file == str(key_file.resolve())
    assert "PRIVATE KEY" not in json.dumps(by_path.model_dump(mode="json", context={"include_secrets": True}))
    saved = store_from("sftp://k3d@192.0.2.7:2222/srv", key_file, known, save_key=True)
    assert saved.private_key_file is None and saved.private_key is not None
    assert saved.private_key.get_secret_value() == key_file.read_text()


@pytest.mark.parametrize("keys_given", [{}, {"private_key": SecretStr("x"), "private_key_file": "/k"}])
def test_a_store_has_its_key_one_way(keys, keys_given):
    _, _, host_key = keys
    with pytest.raises(ValidationError, match=r"private_key_file .* or private_key, not both"):
        SftpStore(host="192.0.2.7", user="k3d", path="/srv", host_key=host_key, **keys_given)


def test_a_key_file_missing_on_this_host_is_named_before_any_connection(keys, tmp_path):
    _, _, host_key = keys
    store = SftpStore(host="192.0.2.7", user="k3d", path="/srv", host_key=host_key,
                      private_key_file=str(tmp_path / "not-here"))  # fmt: skip
    with pytest.raises(StoreError, match=f"cannot read the SSH key file {tmp_path}/not-here on .*: No such file"):
        store.read_path("runs/x")


@pytest.mark.parametrize(
    "url", ["http://k3d@192.0.2.7/srv", "sftp://192.0.2.7/srv", "sftp://k3d@192.0.2.7", "sftp://k3d@/srv"]
)
def test_a_url_that_is_not_a_store_is_refused_naming_the_form(keys, url):
    key_file, known, _ = keys
    with pytest.raises(K3DeployError, match=r"sftp://USER@HOST\[:PORT\]/ABSOLUTE/PATH"):
        store_from(url, key_file, known)


def test_a_host_missing_from_known_hosts_is_refused_not_trusted(keys):
    key_file, known, _ = keys
    with pytest.raises(K3DeployError, match=r"192.0.2.8 is not in .*known_hosts"):
        store_from("sftp://k3d@192.0.2.8/srv", key_file, known)  # port 22: a different known_hosts name


def test_an_unreadable_key_file_is_named(keys, tmp_path):
    _, known, _ = keys
    with pytest.raises(K3DeployError, match="cannot read the key file"):
        store_from("sftp://k3d@192.0.2.7:2222/srv", tmp_path / "absent", known)


@pytest.mark.parametrize("line", ["", "ssh-ed25519", "ssh-dss AAAAB3", "ssh-ed25519 not-base64!", "ssh-ed25519 QUJD"])
def test_a_host_key_must_be_a_readable_public_key(line):
    with pytest.raises(ValueError):
        parse_host_key(line)


@pytest.mark.parametrize(
    ("field", "value"), [("host", "a host; rm -rf /"), ("path", "relative/dir"), ("user", "-oProxyCommand=x")]
)
def test_fields_are_checked_when_the_store_is_made(keys, field, value):
    _, _, host_key = keys
    fields = {"host": "192.0.2.7", "user": "k3d", "path": "/srv", "host_key": host_key,
              "private_key": SecretStr("x"), field: value}  # fmt: skip
    with pytest.raises(ValidationError):
        SftpStore(**fields)


@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd/../../x", "."])
def test_a_key_never_leaves_the_store_folder(keys, key):
    _, _, host_key = keys
    store = SftpStore(host="192.0.2.7", user="k3d", path="/srv/store", host_key=host_key, private_key=SecretStr("x"))
    with pytest.raises(StoreError, match="not a path inside the store"):
        store.full(key)
    assert store.full("runs/r1/record.json") == "/srv/store/runs/r1/record.json"
