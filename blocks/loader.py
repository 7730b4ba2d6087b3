"""Read a deployment YAML into a validated DeploymentConfig, or say exactly what is wrong."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import SecretStr, ValidationError

from k3deploy.core.errors import ConfigError

if TYPE_CHECKING:
    from k3deploy.blocks.deployment import DeploymentConfig

# Secrets come from the environment when the document leaves them out: keeps them out of files.
SECRET_ENV = {
    ("cluster", "ssh", "private_key"): "K3DEPLOY_SSH_PRIVATE_KEY",
    ("models", "hub_token"): "K3DEPLOY_HUB_TOKEN",
    ("image", "registry", "password"): "K3DEPLOY_REGISTRY_PASSWORD",
    ("alerts", "webhook_url"): "K3DEPLOY_ALERT_WEBHOOK",
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
            message = "unknown key (typo? see the configuration reference in docs/configuration.md)"
        problems.append((_field_path(item["loc"]), message))
    return problems


def _inject_secrets(data: dict[str, Any], environ: os._Environ[str] | dict[str, str]) -> None:
    for path, var in SECRET_ENV.items():
        value = environ.get(var)
        if not value:
            continue
        # a section of the document may be left out (its defaults apply); a nested block (registry) may not
        node: Any = data.setdefault(path[0], {})
        for key in path[1:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(path[-1]) is None:
            node[path[-1]] = SecretStr(value)


def _odd_keys(data: dict[Any, Any]) -> list[tuple[str, str]]:
    """Keys that are not text (YAML reads `0:`, `true:`, `null:` as others) in the document and in its sections.

    The document and its sections are Prefect Blocks, which take their fields as keyword arguments: such a key
    would fail there with a bare TypeError (deeper models report it themselves)."""
    sections = [(key, value) for key, value in data.items() if isinstance(key, str) and isinstance(value, dict)]
    problems = []
    for field, part in [("", data), *sections]:
        odd = [key for key in part if not isinstance(key, str)]
        if odd:
            problems.append((field, f"a key must be a name (text), not {', '.join(map(repr, odd))}"))
    return problems


def parse_config(data: Any, source: str | None = None, environ: dict[str, str] | None = None) -> DeploymentConfig:
    """Validate already-parsed data; every problem is reported with its field path."""
    from k3deploy.blocks.checks import placeholders  # imports Prefect: only once the YAML has parsed
    from k3deploy.blocks.deployment import DeploymentConfig

    if not isinstance(data, dict):
        raise ConfigError(
            [("", "the document must be a mapping with cluster, models, image, serve, smoke, bench, accuracy")], source
        )
    if odd := _odd_keys(data):
        raise ConfigError(odd, source)
    _inject_secrets(data, os.environ if environ is None else environ)
    try:
        try:
            return DeploymentConfig.model_validate(data)
        except ValidationError as err:
            left = placeholders(data)
            marked = {field for field, _ in left}
            problems = left + [p for p in _pydantic_problems(err) if p[0] not in marked]
            raise ConfigError(problems, source) from None
        except ConfigError as err:
            raise ConfigError(err.problems, source) from None
    except RecursionError:  # `a: &x [*x]`: a YAML alias inside its own anchor makes a cycle
        problem = "the document contains itself (a YAML alias inside its own anchor) or is nested too deeply"
        raise ConfigError([("", problem)], source) from None


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> DeploymentConfig:
    """Load and validate a deployment document from a YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError([("", f"cannot read the file: {err.strerror}")], str(path)) from None
    except UnicodeDecodeError as err:
        problem = f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start}"
        raise ConfigError([("", problem)], str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError([("", f"{where}not valid YAML: {getattr(err, 'problem', err)}")], str(path)) from None
    except (ValueError, TypeError, AttributeError, IndexError, OverflowError) as err:  # 2001-02-30, `!!int `
        problem = f"not valid YAML: a value that cannot be read as its type ({err}); quote it to keep it a string"
        raise ConfigError([("", problem)], str(path)) from None
    except RecursionError:
        raise ConfigError([("", "not valid YAML: nested too deeply")], str(path)) from None
    return parse_config(data, str(path), environ)
