"""The teardown stage, on its own: remove this config's containers on every node (one run's, if named)."""

from __future__ import annotations

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.launch.steps import remove_containers
from prefect import flow
from prefect.artifacts import create_table_artifact

DEFAULT_CONFIG = "configs/local.yaml"


@flow(name="teardown")
def teardown(config: str = DEFAULT_CONFIG, run_id: str | None = None) -> dict[str, list[str]]:
    """Idempotent: a second run removes nothing and still proves nothing is left."""
    cfg = load_config(config)
    removed = remove_containers(cfg, run_id)
    create_table_artifact(
        [{"node": node, "removed": ", ".join(names) or "-"} for node, names in removed.items()], key="teardown"
    )
    return removed
