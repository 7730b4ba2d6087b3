"""Orchestration only: one Prefect flow per stage of DESIGN.md, and `validate` chaining them."""
