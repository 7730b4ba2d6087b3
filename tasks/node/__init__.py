"""Scripts that run ON the nodes (sent over SSH and run by the node's python3): standard library only, which
tests/unit/test_layers.py checks."""
