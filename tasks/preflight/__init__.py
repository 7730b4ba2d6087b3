"""Preflight: per-node facts gathered before any stage does work, pyinfra style (a command and a parser each)."""
