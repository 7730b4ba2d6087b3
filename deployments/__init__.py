"""Deployment definitions: nightly schedule, UI-triggered runs, per-stage reruns."""
