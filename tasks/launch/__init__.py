"""Launch stage: start the containers in order, watch their logs, wait for a ready service."""
