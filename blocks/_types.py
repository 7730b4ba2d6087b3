"""Shared field types: every string that can reach a shell or a file name is checked here."""

from __future__ import annotations

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


Text = Annotated[str, AfterValidator(_no_control_chars), AfterValidator(_not_an_option)]
"""A value that lands in a command line as a flag's argument or a positional."""
Arg = Annotated[str, AfterValidator(_no_control_chars)]
"""A raw extra argument or environment value, passed through as one argv element."""
AbsPath = Annotated[str, AfterValidator(_no_control_chars), AfterValidator(_absolute_path)]
EnvName = Annotated[str, AfterValidator(_env_name)]


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
