"""Reading a tool's output as evidence, strictly (no I/O): a count is an integer ≥ 0, a figure a finite number.

Python's json takes NaN and ±Infinity, which no tool we read means as a figure; they are refused here,
as are strings and booleans where a number stands. Every error names the key, and the caller the file.
"""

from __future__ import annotations

import json
import math
from typing import Any

from k3deploy.core.errors import UnreadableEvidence


def _reject_constant(name: str) -> float:
    raise UnreadableEvidence(f"holds {name}, which is not a number JSON allows")


def _one_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once: json keeps the last of a key given twice, silently."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise UnreadableEvidence(f"gives {key!r} twice, which a tool never writes: which one is meant is unknown")
        seen[key] = value
    return seen


def load_json_object(text: str, what: str) -> dict[str, Any]:
    """A JSON object, strictly: NaN and ±Infinity (which Python's json accepts) are refused, and a key given
    twice in an object, naming `what`."""
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_one_each)
    except UnreadableEvidence as err:
        raise UnreadableEvidence(f"{what} {err}") from None
    except (ValueError, RecursionError) as err:
        raise UnreadableEvidence(f"{what} is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise UnreadableEvidence(f"{what} is not a JSON object")
    return data


def count(data: dict[str, Any], key: str, what: str) -> int:
    """A count: an integer ≥ 0 (not a bool, not a float, not a string)."""
    value = data.get(key)
    if key not in data:
        raise UnreadableEvidence(f"{what} lacks {key}")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnreadableEvidence(f"{what}'s {key} is {str(value)[:40]!r}, not a count")
    return value


def figure(data: dict[str, Any], key: str, what: str) -> float:
    """A figure: a finite number (not a bool, not a string)."""
    return finite(data.get(key), f"{what}'s {key}")


def finite(value: Any, what: str) -> float:
    """`value` as a finite float, else UnreadableEvidence naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnreadableEvidence(f"{what} is {str(value)[:40]!r}, not a number")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        raise UnreadableEvidence(f"{what} is out of range ({len(str(value))} digits)") from None
    if not math.isfinite(number):
        raise UnreadableEvidence(f"{what} is {number}, not a finite number")
    return number
