"""Read a deployment YAML into a validated DeploymentConfig, or say exactly what is wrong."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import SecretStr, ValidationError

from k3deploy.errors import ConfigError

if TYPE_CHECKING:
    from k3deploy.blocks.deployment import DeploymentConfig

# Secrets come from the environment when the document leaves them out: keeps them out of files.
SECRET_ENV = {
    ("cluster", "ssh", "private_key"): "K3DEPLOY_SSH_PRIVATE_KEY",
    ("models", "hub_token"): "K3DEPLOY_HUB_TOKEN",
    ("image", "registry", "password"): "K3DEPLOY_REGISTRY_PASSWORD",
}


def _field_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for a bad mapping key; the key itself names the field
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _pydantic_problems(err: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for item in err.errors(include_url=False, include_input=False):
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key (typo? see the configuration reference in README.md)"
        problems.append((_field_path(item["loc"]), message))
    return problems


def _inject_secrets(data: dict[str, Any], environ: os._Environ[str] | dict[str, str]) -> None:
    for path, var in SECRET_ENV.items():
        value = environ.get(var)
        node: Any = data
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if value and isinstance(node, dict) and node.get(path[-1]) is None:
            node[path[-1]] = SecretStr(value)


def parse_config(data: Any, source: str | None = None, environ: dict[str, str] | None = None) -> DeploymentConfig:
    """Validate already-parsed data; every problem is reported with its field path."""
    from k3deploy.blocks.checks import placeholders  # imports Prefect: only once the YAML has parsed
    from k3deploy.blocks.deployment import DeploymentConfig

    if not isinstance(data, dict):
        raise ConfigError(
            [("", "the document must be a mapping with cluster, models, image, serve, smoke, bench, accuracy")], source
        )
    _inject_secrets(data, os.environ if environ is None else environ)
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError as err:
        left = placeholders(data)
        marked = {field for field, _ in left}
        problems = left + [p for p in _pydantic_problems(err) if p[0] not in marked]
        raise ConfigError(problems, source) from None
    except ConfigError as err:
        raise ConfigError(err.problems, source) from None


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> DeploymentConfig:
    """Load and validate a deployment document from a YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError([("", f"cannot read the file: {err.strerror}")], str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError([("", f"{where}not valid YAML: {getattr(err, 'problem', err)}")], str(path)) from None
    return parse_config(data, str(path), environ)
