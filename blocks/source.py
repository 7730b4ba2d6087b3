"""How a flow is told its deployment, and turning that into the parsed config once, at the boundary."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.loader import load_config
from k3deploy.core.errors import ConfigError

ConfigSource = str | DeploymentConfig
"""How a flow is told its deployment: a YAML path, a saved DeploymentConfig block's name, or the config."""


# Configs a command has parsed and checked, by the source its flows are given (see `parsed`).
_PARSED: dict[str, DeploymentConfig] = {}


@contextmanager
def parsed(source: str, cfg: DeploymentConfig) -> Iterator[None]:
    """While inside, `resolve_config(source)` is `cfg`: a command that parsed and checked its config before
    Prefect started hands that on to its flows, whose parameter stays the path or block name (never the
    config, which holds secrets), so the config is parsed once per command."""
    _PARSED[source] = cfg
    try:
        yield
    finally:
        _PARSED.pop(source, None)


def is_yaml_path(source: str) -> bool:
    """Is `source` a YAML file's path rather than a saved block's name? The one place this is decided: a block's
    name has no `/` and no YAML suffix, and is not a file here."""
    return source.endswith((".yaml", ".yml")) or "/" in source or Path(source).exists()


def resolve_config(source: ConfigSource) -> DeploymentConfig:
    """The parsed config, whatever form it came in; resolved once, at the boundary of a run."""
    if isinstance(source, DeploymentConfig):
        return source
    if source in _PARSED:
        return _PARSED[source]
    if is_yaml_path(source):
        return load_config(source)
    try:
        # Prefect's async_dispatch types the call as `Self | Coroutine`; a sync caller gets the block.
        return DeploymentConfig.load(source)  # type: ignore[return-value]
    except ValueError:
        problem = "no such YAML file, and no saved DeploymentConfig block of that name"
        raise ConfigError([("", problem)], source) from None
