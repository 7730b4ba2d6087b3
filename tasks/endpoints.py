"""Node 0's service as every stage reaches it: its URL and which node runs each DP rank.

One place, so that readiness, smoke, bench, accuracy and the liveness watch all talk to the same address:
node 0's serving IP (`local_ip`, else its `address`), the one vLLM's ranks are told to use.
"""

from __future__ import annotations

from k3deploy.blocks.deployment import DeploymentConfig


def service_url(cfg: DeploymentConfig) -> str:
    return f"http://{cfg.cluster.nodes[0].serving_ip}:{cfg.serve.service_port}"


def engines(cfg: DeploymentConfig) -> dict[str, str]:
    """DP rank (vLLM's `engine` label) → the node that runs it."""
    local = cfg.serve.data_parallel_size_local
    return {str(i * local + k): node.name for i, node in enumerate(cfg.cluster.nodes) for k in range(local)}
