"""The configuration reference in Markdown, made from the Blocks' own field descriptions."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from k3deploy.blocks.deployment import DeploymentConfig

SECTIONS = tuple(DeploymentConfig.model_fields)  # every section, in the order the config gives them


def _model_of(annotation: Any) -> type[BaseModel] | None:
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    for candidate in (annotation, *args):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(see below)"
    if isinstance(value, SecretStr):
        return "secret"
    text = json.dumps(value, default=str)
    return f"`{text}`" if len(text) <= 60 else f"`{text[:57]}…`"


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows, nested = [], []
    for name, info in model.model_fields.items():
        key = f"{prefix}.{name}"
        rows.append(f"| `{key}` | {_default(info)} | {info.description or ''} |")
        sub = _model_of(info.annotation)
        if sub is not None:
            nested.append((sub, key))
    for sub, key in nested:
        rows += _rows(sub, key)
    return rows


def config_reference() -> str:
    """One table per section: key, default, meaning."""
    out = []
    for section in SECTIONS:
        model = _model_of(DeploymentConfig.model_fields[section].annotation)
        if model is None:
            raise TypeError(f"DeploymentConfig.{section} is not a model")
        out += [f"### `{section}`", "", "| key | default | meaning |", "|---|---|---|", *_rows(model, section), ""]
    return "\n".join(out)
