"""The teardown stage, on its own: remove this config's containers on every node (one run's, if named)."""

from prefect import flow

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.errors import TeardownFailed
from k3deploy.stage import Finding, StageResult
from k3deploy.tasks.launch.steps import remove_containers
from k3deploy.tasks.stage_run import StageRun


@flow(name="teardown")
def teardown(config: ConfigSource, run_id: str | None = None) -> StageResult:
    """Idempotent: a second run removes nothing and still proves nothing is left."""
    cfg = resolve_config(config)
    run = StageRun("teardown", TeardownFailed)
    with run.guard():
        removed = remove_containers(cfg, run_id)
    run.findings = [
        Finding(node, "nothing left", True, ", ".join(names) or "nothing to remove") for node, names in removed.items()
    ]
    run.table("removed", [{"node": node, "removed": ", ".join(names) or "-"} for node, names in removed.items()])
    run.data = {"removed": removed}
    count = sum(map(len, removed.values()))
    return run.passed(
        f"removed {count}: {', '.join(n for names in removed.values() for n in names)}"
        if count
        else "nothing was running"
    )
