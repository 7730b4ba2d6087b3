"""k3deploy: validate a Kimi-K3 deployment on vLLM-Ascend from bare nodes to benchmarked service."""
