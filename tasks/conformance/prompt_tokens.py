"""How many tokens a chat request's prompt is, counted by k3deploy with the served checkpoint's own tokenizer and chat
template (its tokenizer.json and tokenizer_config.json), rendered as transformers' apply_chat_template renders it:
a sandboxed Jinja environment with trim_blocks and lstrip_blocks, `tojson` as json.dumps, the generation prompt on.
The server's `usage.prompt_tokens` must be this count: a server that counts otherwise bills and limits wrongly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


class PromptCountError(ValueError):
    """The served tokenizer files cannot count a prompt (no chat template, not a tokenizers JSON, a template error)."""


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


@dataclass(frozen=True)
class PromptCounter:
    tokenizer: Tokenizer
    template: str

    @classmethod
    def from_files(cls, tokenizer_json: str, tokenizer_config_json: str) -> PromptCounter:
        try:
            tokenizer = Tokenizer.from_str(tokenizer_json)
        except Exception as err:  # the tokenizers library raises its own Exception type
            raise PromptCountError(f"tokenizer.json is not a tokenizers file: {err}") from None
        try:
            config = json.loads(tokenizer_config_json)
        except ValueError as err:
            raise PromptCountError(f"tokenizer_config.json is not JSON: {err}") from None
        template = config.get("chat_template") if isinstance(config, dict) else None
        if not isinstance(template, str) or not template:
            raise PromptCountError("tokenizer_config.json has no chat_template (a string)")
        return cls(tokenizer, template)

    def render(self, body: dict[str, Any]) -> str:
        """The prompt text of a chat request: its messages, its tools, its chat_template_kwargs."""
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        kwargs = dict(body.get("chat_template_kwargs") or {})
        try:
            return env.from_string(self.template).render(
                messages=body["messages"], tools=body.get("tools"), add_generation_prompt=True, **kwargs
            )
        except TemplateError as err:
            raise PromptCountError(f"the chat template does not render: {err}") from None

    def count(self, body: dict[str, Any]) -> int:
        return len(self.tokenizer.encode(self.render(body), add_special_tokens=False).ids)
