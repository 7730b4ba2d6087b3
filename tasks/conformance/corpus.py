"""The tool schemas the conformance stage forces calls to: made by this project, here, from JSON Schema's validation
vocabulary (draft 2020-12: type, enum, const, required, properties, additionalProperties, items, minItems, maxItems,
uniqueItems, minimum, maximum, exclusiveMinimum, minLength, maxLength, pattern, format, anyOf, oneOf).

Each schema is a tool's `parameters` object, built from a small set of property shapes, so that every keyword appears
in many schemas, alone and nested, at the top level and inside objects and arrays. Each shape carries one valid value,
so each schema has a valid example (a test checks it): a failure is never the corpus asking the impossible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# (property schema, one valid value) — the shapes every schema is made of.
SHAPES: dict[str, tuple[dict[str, Any], Any]] = {
    "text": ({"type": "string", "description": "free text"}, "hello"),
    "code": ({"type": "string", "pattern": "^[A-Z]{3}$", "description": "an IATA airport code"}, "CDG"),
    "day": ({"type": "string", "format": "date"}, "2026-12-07"),
    "email": ({"type": "string", "format": "email"}, "ops@example.com"),
    "short": ({"type": "string", "minLength": 2, "maxLength": 8}, "abc"),
    "unit": ({"type": "string", "enum": ["celsius", "fahrenheit", "kelvin"]}, "celsius"),
    "count": ({"type": "integer", "minimum": 1, "maximum": 10}, 3),
    "ratio": ({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, 0.5),
    "flag": ({"type": "boolean"}, True),
    "maybe": ({"type": ["string", "null"]}, None),
    "fixed": ({"const": "v1"}, "v1"),
    "tags": ({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4, "uniqueItems": True}, ["a"]),
    "scores": ({"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 2}, [1, 2]),
    "point": (
        {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
                                          "lon": {"type": "number", "minimum": -180, "maximum": 180}},
         "required": ["lat", "lon"], "additionalProperties": False},
        {"lat": 48.85, "lon": 2.35},
    ),
    "either": ({"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]}, 7),
    "shape": (
        {"oneOf": [
            {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number", "minimum": 0}},
             "required": ["kind", "r"], "additionalProperties": False},
            {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0}},
             "required": ["kind", "side"], "additionalProperties": False},
        ]},
        {"kind": "circle", "r": 1.5},
    ),
    "people": (
        {"type": "array", "minItems": 1, "items": {
            "type": "object", "properties": {"name": {"type": "string", "minLength": 1},
                                             "age": {"type": "integer", "minimum": 0, "maximum": 150}},
            "required": ["name"], "additionalProperties": False}},
        [{"name": "Ada"}],
    ),
    "window": (
        {"type": "object", "properties": {"start": {"type": "string", "format": "date-time"},
                                          "hours": {"type": "integer", "minimum": 1, "maximum": 72},
                                          "zone": {"type": "string", "enum": ["UTC", "CET", "JST"]}},
         "required": ["start", "hours"]},
        {"start": "2026-12-07T09:00:00Z", "hours": 2},
    ),
}  # fmt: skip

# What a tool of each domain does, and the names its parameters take (a name per shape it uses).
DOMAINS: list[tuple[str, str, list[str]]] = [
    ("get_weather", "Current weather of a place", ["city", "unit", "day", "point"]),
    ("book_flight", "Book a seat on a flight", ["origin", "destination", "day", "passengers", "people"]),
    ("send_email", "Send an email", ["to", "subject", "body", "urgent", "tags"]),
    ("create_ticket", "Open a support ticket", ["title", "severity", "labels", "owner", "due"]),
    ("search_docs", "Search the documentation", ["query", "limit", "threshold", "filters", "version"]),
    ("schedule_job", "Schedule a batch job", ["name", "window", "retries", "priority", "notify"]),
    ("draw_shape", "Draw a shape on the canvas", ["shape", "colour", "opacity", "label", "layer"]),
    ("lookup_user", "Look up a user account", ["user", "email", "active", "fields", "note"]),
    ("convert_units", "Convert a measurement", ["value", "from_unit", "to_unit", "precision", "rounding"]),
    ("rate_answers", "Record graders' scores", ["scores", "grader", "rubric", "comment", "final"]),
    ("reserve_table", "Reserve a restaurant table", ["venue", "guests", "day", "seating", "contact"]),
    ("deploy_model", "Deploy a model version", ["model", "replicas", "canary", "region", "owner"]),
]

# The shapes, in turn, that a domain's parameters take; rotated per schema so every shape meets every position.
ORDER = list(SHAPES)


@dataclass(frozen=True)
class ToolSchema:
    """One corpus entry: the function's name, description and parameters, and a valid example of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]
    example: dict[str, Any]

    def tool(self, strict: bool = False) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "description": self.description, "parameters": self.parameters}
        if strict:
            function["strict"] = True
        return {"type": "function", "function": function}


def _schema(index: int) -> ToolSchema:
    """The index-th schema: a domain, 1–5 of its parameters, each of a rotating shape, a varying `required`."""
    name, description, params = DOMAINS[index % len(DOMAINS)]
    round_ = index // len(DOMAINS)
    width = 1 + (index + round_) % len(params)
    chosen = params[:width]
    properties, example = {}, {}
    for position, param in enumerate(chosen):
        shape, value = SHAPES[ORDER[(index * 7 + position * 3 + round_) % len(ORDER)]]
        properties[param] = dict(shape)
        example[param] = value
    required = [
        [],  # all optional
        chosen[:1],
        chosen,  # all required
        chosen[: max(1, width // 2)],
    ][(index + round_) % 4]
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = list(required)
    if index % 3 == 0:
        parameters["additionalProperties"] = False
    return ToolSchema(f"{name}_{index:03d}", f"{description} (case {index})", parameters, example)


def corpus(size: int = 120) -> list[ToolSchema]:
    """The first `size` schemas (120 in all; a smaller suite takes a prefix, which still mixes every shape)."""
    if not 1 <= size <= 120:
        raise ValueError(f"the corpus has 120 schemas; {size} asked")
    return [_schema(i) for i in range(size)]


def keywords(schema: Any) -> set[str]:
    """Every JSON Schema keyword a schema uses, at any depth (for the corpus' coverage test and the report)."""
    found: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.update(k for k in node if k not in ("description",))
            stack.extend(v for k, v in node.items() if k not in ("properties", "enum", "const"))
            stack.extend(node.get("properties", {}).values())
        elif isinstance(node, list):
            stack.extend(node)
    return found
