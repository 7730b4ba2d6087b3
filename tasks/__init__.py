"""Units of work: pure helpers (command builders, parsers, checks) and thin @task wrappers."""
