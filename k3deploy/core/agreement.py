"""What most nodes agree on: one rule for every stage that compares nodes (comm, image, models)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TypeVar

V = TypeVar("V", bound=Hashable)


def majority(values: Iterable[V]) -> V | None:
    """The most common value, or None when two values tie for first place (nobody can tell the odd one)."""
    top = Counter(values).most_common(2)
    if not top or (len(top) == 2 and top[0][1] == top[1][1]):
        return None
    return top[0][0]


def split(values: Mapping[str, V], show: Callable[[V], str] = str) -> str:
    """'a on node0, node1; b on node2': how nodes divide when there is no majority."""
    groups: dict[V, list[str]] = {}
    for node, value in values.items():
        groups.setdefault(value, []).append(node)
    return "; ".join(f"{show(value)} on {', '.join(nodes)}" for value, nodes in groups.items())
