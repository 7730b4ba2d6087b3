"""The conformance stage: the served API keeps the Kimi-K3 contract (tool calls, streams, usage, parameters)."""
