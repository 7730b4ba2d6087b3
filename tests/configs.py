"""Site values for the reference config, so tests start from configs/kimi-k3-a3.yaml itself."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

REFERENCE = Path(__file__).parents[1] / "configs" / "kimi-k3-a3.yaml"
DIGEST = "sha256:" + "ab" * 32
SITE = {
    "<MODEL_ROOT>": "/path/to/models",
    "<IMAGE_DIGEST>": DIGEST,
    **{f"<NODE{i}_IP>": f"192.0.2.{10 + i}" for i in range(4)},
    **{f"<NODE{i}_NIC>": f"enp{i}s0" for i in range(4)},
}


def reference_text() -> str:
    return REFERENCE.read_text()


def site_data() -> dict[str, Any]:
    """The reference document with every placeholder replaced by a site value."""
    text = reference_text()
    for placeholder, value in SITE.items():
        text = text.replace(placeholder, value)
    return yaml.safe_load(text)


def with_changes(data: dict[str, Any], **dotted: Any) -> dict[str, Any]:
    """Copy of `data` with `a__b__0__c=value` changes applied (lists indexed by number)."""
    out = copy.deepcopy(data)
    for path, value in dotted.items():
        keys = path.split("__")
        node: Any = out
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        last = keys[-1]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return out
