"""Orchestration only: one Prefect flow per stage of DESIGN.md, and `validate` chaining them."""
# Flow modules keep real annotations (no `from __future__ import annotations`): Prefect builds the
# parameter model from them, also when a runner loads the file by path.
