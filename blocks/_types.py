"""Shared field types: every string that can reach a shell or a file name is checked here."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from prefect.blocks.core import Block
from pydantic import AfterValidator, ConfigDict, model_validator

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _no_control_chars(value: str) -> str:
    # A newline or NUL in a path or flag value is never intended and breaks logs and shells.
    match = _CONTROL.search(value)
    if match:
        raise ValueError(f"contains the control character {match.group()!r}; remove it")
    return value


def _not_an_option(value: str) -> str:
    # Values become flag arguments and positionals: "-x" would be read as an option, "" as nothing.
    if not value:
        raise ValueError("must not be empty")
    if value.startswith("-"):
        raise ValueError(f"{value!r} starts with '-' and would be read as a command-line option")
    return value


def _absolute_path(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path (starting with /), got {value!r}")
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    return value


_PLACEHOLDER = re.compile(r"<[A-Z0-9_]+>")  # left for the placeholder check, which names it as such
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # Docker's container-name rule; node names follow it too
_REPO_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
# Docker's reference grammar (distribution/reference): [domain[:port]/]path[:tag]
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?))*(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?")


def _kept_placeholder(value: str) -> bool:
    return _PLACEHOLDER.fullmatch(value) is not None


def _host(value: str) -> str:
    """An IP address or a DNS host name: what SSH and vLLM can be given."""
    if _kept_placeholder(value):
        return value
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    if len(value) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        raise ValueError(f"{value!r} is neither an IP address nor a host name")
    return value


def _ip(value: str) -> str:
    if _kept_placeholder(value):
        return value
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address") from None


def _interface(value: str) -> str:
    """A Linux interface name (the kernel's dev_valid_name): 1-15 characters, no '/', ':' or white space."""
    if _kept_placeholder(value):
        return value
    if not 0 < len(value) < 16 or value in (".", "..") or re.search(r"[/:\s]", value):
        raise ValueError(f"{value!r} is not a network interface name (1-15 characters, no '/', ':' or spaces)")
    return value


def _name(value: str) -> str:
    if not _NAME.fullmatch(value) or len(value) > 128:
        raise ValueError(
            f"{value!r} is not a valid name: letters, digits, '_', '.', '-', starting with a letter or digit"
        )
    return value


def _image_ref(value: str) -> str:
    if not _IMAGE.fullmatch(value) or len(value) > 255:
        raise ValueError(f"{value!r} is not an image reference such as registry.example.com/org/image:tag")
    return value


def _repo_id(value: str) -> str:
    parts = value.split("/")
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(p) for p in parts):
        raise ValueError(f"{value!r} is not a hub repository id such as org/name")
    return value


def _bind(value: str, modes: tuple[str, ...], what: str, volumes: bool) -> str:
    """host:container[:mode], the container side an absolute path (a lone absolute path: the same path inside).

    The host side is an absolute path, or for a mount a named volume.
    """
    parts = value.split(":")
    paths, mode = (parts[:2], parts[2]) if len(parts) == 3 else (parts, None)
    host_ok = paths[0].startswith("/") or (volumes and len(paths) == 2 and _NAME.fullmatch(paths[0]) is not None)
    if len(parts) > 3 or not host_ok or not all(p.startswith("/") for p in paths[1:]) or mode not in (None, *modes):
        host = "an absolute host path or a volume name" if volumes else "an absolute host path"
        raise ValueError(f"{value!r} is not a {what} spec: {host}[:container path[:{'|'.join(modes)}]]")
    return value


def _mount(value: str) -> str:
    return _bind(value, ("ro", "rw", "z", "Z"), "mount", volumes=True)


def _device(value: str) -> str:
    return _bind(value, ("r", "w", "m", "rw", "rm", "wm", "rwm"), "device", volumes=False)


Text = Annotated[str, AfterValidator(_no_control_chars), AfterValidator(_not_an_option)]
"""A value that lands in a command line as a flag's argument or a positional."""
Arg = Annotated[str, AfterValidator(_no_control_chars)]
"""A raw extra argument or environment value, passed through as one argv element."""
AbsPath = Annotated[str, AfterValidator(_no_control_chars), AfterValidator(_absolute_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]
HostAddress = Annotated[str, AfterValidator(_host)]
IPAddress = Annotated[str, AfterValidator(_ip)]
InterfaceName = Annotated[str, AfterValidator(_not_an_option), AfterValidator(_interface)]
Name = Annotated[str, AfterValidator(_name)]
"""A container, network or node name: it lands in labels, process names and file names."""
ImageRef = Annotated[str, AfterValidator(_image_ref)]
RepoId = Annotated[str, AfterValidator(_repo_id)]
MountSpec = Annotated[str, AfterValidator(_mount)]
DeviceSpec = Annotated[str, AfterValidator(_device)]


class StrictBlock(Block):
    """A Block that refuses unknown keys, so a typo in the YAML is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_block_type_slug(cls, data: Any) -> Any:
        # Prefect stores nested blocks with their type slug; it is not a configuration key.
        if isinstance(data, dict) and "block_type_slug" in data:
            data = {k: v for k, v in data.items() if k != "block_type_slug"}
        return data
