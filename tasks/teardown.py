"""Teardown: every server of a config (or of one run) stopped and removed on every node, and proven gone.

Shared by the teardown stage, launch's clean-up on failure and the abort hook (flows/run_abort.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import K3DeployError, TeardownIncomplete
from k3deploy.tasks.render import CONFIG_LABEL, RUN_LABEL
from k3deploy.tasks.runtime import ServersSurvived, node_runtime


def remove_servers(cfg: DeploymentConfig, run_id: str | None = None) -> dict[str, list[str]]:
    """Stop and remove this config's containers or processes (of one run, when given) on every node it can
    reach, then prove none is left there; a node it cannot reach or trust does not stop the others."""
    labels = {CONFIG_LABEL: cfg.fingerprint()} | ({RUN_LABEL: run_id} if run_id else {})

    def clear(node: str) -> tuple[list[str], list[str]]:
        with node_runtime(cfg, node) as runtime:
            try:
                gone = runtime.remove(labels)
            except ServersSurvived as err:  # the engine outlived its stop: named, never called removed
                return err.removed, [f"{name} ({left})" for name, left in err.survivors.items()]
            return gone, runtime.names(labels)

    nodes = [n.name for n in cfg.cluster.nodes]
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = {node: pool.submit(clear, node) for node in nodes}
    removed: dict[str, list[str]] = {}
    problems: dict[str, str] = {}
    for node, future in futures.items():
        try:
            gone, left = future.result()
        except K3DeployError as err:
            problems[node] = f"not cleared, could not reach or trust it: {err}"
            continue
        removed[node] = gone
        if left:
            problems[node] = f"still running after removal: {', '.join(left)}"
    if problems:
        raise TeardownIncomplete(removed, problems)
    return removed


@task(name="remove servers", cache_policy=NO_CACHE)
def remove_servers_task(cfg: DeploymentConfig, run_id: str | None = None) -> dict[str, list[str]]:
    removed = remove_servers(cfg, run_id)
    get_run_logger().info("removed: %s", {n: names for n, names in removed.items() if names} or "nothing")
    return removed


def removed_summary(removed: dict[str, list[str]]) -> str:
    """'removed 4: vllm-kimi-k3 on node0, node1, node2 and node3.': every name with the nodes it was on."""
    on: dict[str, list[str]] = {}
    for node, names in removed.items():
        for name in names:
            on.setdefault(name, []).append(node)
    if not on:
        return "nothing was running."
    count = sum(map(len, on.values()))
    return f"removed {count}: " + _and([f"{name} on {_and(nodes)}" for name, nodes in on.items()]) + "."


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
