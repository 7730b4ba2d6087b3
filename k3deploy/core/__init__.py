"""The base layer: errors, the stage contract, agreement across nodes, the runs store's paths.

It imports nothing of the project."""
