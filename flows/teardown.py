"""The teardown stage, on its own: remove this config's containers on every node (one run's, if named)."""

from prefect import flow

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import TeardownFailed, TeardownIncomplete
from k3deploy.core.stage import Finding, StageResult
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.teardown import remove_servers_task, removed_summary


@flow(name="teardown")
def teardown(config: ConfigSource, run_id: str | None = None) -> StageResult:
    """Idempotent: a second run removes nothing and still proves nothing is left."""
    cfg = resolve_config(config)
    run = StageRun("teardown", TeardownFailed)
    problems: dict[str, str] = {}
    with run.guard():
        try:
            removed = remove_servers_task(cfg, run_id)
        except TeardownIncomplete as err:  # what could be removed was; each other node is named
            removed, problems = err.removed, err.problems
    run.findings = [
        Finding(node, "nothing left", True, ", ".join(names) or "nothing to remove") for node, names in removed.items()
    ] + [Finding(node, "nothing left", False, why) for node, why in problems.items()]
    run.table("removed", [{"node": node, "removed": ", ".join(names) or "-"} for node, names in removed.items()])
    run.data = {"removed": removed, "not_cleared": problems}
    if problems:
        run.failed(f"{len(problems)} node(s) not cleared ({', '.join(problems)}); run teardown again once "
                   f"they are reachable and what survives there is stopped.")  # fmt: skip
    return run.passed(removed_summary(removed))


@flow(name="clear-cluster")
def clear_cluster(config: str, run_id: str = "") -> StageResult:
    """The teardown deployment's flow: its form takes a config's name or path, never the config itself (a form
    of the whole config would show its secret fields), and no `| None` (the form's type switch).

    Args:
        config: The name of a saved DeploymentConfig block, or a deployment YAML path on the worker.
        run_id: Remove only this run's servers; empty: every server of this config.
    """
    return teardown(config, run_id or None)
