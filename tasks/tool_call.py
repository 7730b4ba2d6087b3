"""The tool-call exchange: the tools a request declares and the question asked. The smoke check asks it of the
served model, and the local profile's scripted checkpoint is made to answer it; so it belongs to neither."""

from __future__ import annotations

from typing import Any

# The tools every tool-call request declares; the question the local profile's scripted checkpoint answers
# with a call to the first one.
TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
DECOY_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = [TOOL_SCHEMA, DECOY_TOOL]
QUESTION = "What is the weather in Paris?"
TOOL_RESULT = {"city": "Paris", "temperature_c": 18, "sky": "cloudy"}
