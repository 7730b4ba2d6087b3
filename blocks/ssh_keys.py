"""SSH keys as the configuration holds them: a private key given in memory, a pinned host key line, and how
known_hosts names a host. Parsing only; the transports and the store's block connect with them."""

from __future__ import annotations

import base64
import binascii
import io

import paramiko
from pydantic import SecretStr

from k3deploy.core.errors import TransportError

_KEY_TYPES = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)
_HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")


def load_private_key(key: SecretStr) -> paramiko.PKey:
    """Parse an in-memory private key without ever putting its text in an error."""
    for key_type in _KEY_TYPES:
        try:
            return key_type.from_private_key(io.StringIO(key.get_secret_value()))
        except (paramiko.SSHException, ValueError):
            continue
    raise TransportError("ssh", "the SSH private key is not an unencrypted Ed25519, ECDSA or RSA key")


def host_key_entry(host: str, port: int) -> str:
    """How known_hosts names a host: bare for port 22, [host]:port otherwise."""
    return host if port == 22 else f"[{host}]:{port}"


def parse_host_key(line: str) -> tuple[str, paramiko.PKey]:
    """`ssh-ed25519 AAAA… [comment]` as paramiko's key; a clear error for anything else."""
    parts = line.split()
    if len(parts) < 2 or parts[0] not in _HOST_KEY_TYPES:
        raise ValueError(f"must be a public key line such as 'ssh-ed25519 AAAA…', one of {', '.join(_HOST_KEY_TYPES)}")
    try:
        return parts[0], paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1], validate=True))
    except (binascii.Error, paramiko.SSHException, ValueError) as err:
        raise ValueError(f"not a readable {parts[0]} key: {err}") from None
