"""The deployments, one source of truth: nightly validate, validate from the UI, one per stage, bisect, tune,
teardown.

Every deployment runs the installed package's flows by module path on a `process` work pool, so a
worker host needs only `pip install` of this repository; the deployment config is a saved block's
name (or a YAML path on the workers). Read from the stage registry, like the CLI and `validate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.deployments.runner import EntrypointType
from prefect.exceptions import ObjectNotFound
from prefect.schedules import Cron
from prefect.settings import PREFECT_UI_URL
from prefect.workers.process import ProcessWorker

from k3deploy.blocks.fleet import ServerConfig
from k3deploy.blocks.source import resolve_config
from k3deploy.core.paths import runs_dir
from k3deploy.deployments.automations import apply_automations
from k3deploy.flows.bisect import bisect
from k3deploy.flows.cluster_lock import cluster_label
from k3deploy.flows.registry import FINAL, STAGES, StageOptions
from k3deploy.flows.server_watch import client_retries
from k3deploy.flows.teardown import clear_cluster
from k3deploy.flows.tune import tune
from k3deploy.flows.validate import NIGHTLY, is_nightly, validate
from k3deploy.tasks.transport.sftp_store import shared_store

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment

POOL = "k3deploy"
NIGHTLY_CRON = "30 1 * * *"
SOAK_CRON = "0 2 * * 6"  # Saturday 02:00: hours of steady load when nobody needs the cluster
TAGS = ["k3deploy"]


def deployments(
    config: str,
    cron: str = NIGHTLY_CRON,
    timezone: str = "UTC",
    where: Path | None = None,
    runs: Path | None = None,
    cluster: str = "",
    shared: bool = False,
    server: ServerConfig | None = None,
) -> list[RunnerDeployment]:
    """nightly (validate on a cron), validate (the UI's form), soak (weekly, with the soak), stage-<name> (ad hoc),
    bisect, tune, teardown.

    A process worker runs each flow in a scratch folder: the runs start in `where` (relative paths of the
    config resolve as they did where `k3deploy deploy` ran) and write records and reports to `runs`.
    With `cluster`, every name ends in `-<cluster>` and carries its tag: one server holds a fleet's. With
    `shared` (the server has a shared store) no runs folder is pinned: each worker host keeps its own (its
    K3DEPLOY_RUNS_DIR), and the store joins them. `server`: the config's (its defaults when not given).
    """
    where = (where or Path.cwd()).resolve()
    server = server or ServerConfig()
    env = {} if shared else {"K3DEPLOY_RUNS_DIR": str((runs or runs_dir()).resolve())}
    # A flow run's calls to the server are retried through server.grace_seconds (flows/server_watch.py); it beats
    # every server.heartbeat_seconds, so the server can tell a run that died (deployments/automations.py).
    env["PREFECT_CLIENT_MAX_RETRIES"] = str(client_retries(server.grace_seconds))
    env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] = str(server.heartbeat_seconds)
    job = {"working_dir": str(where), "env": env}
    common: dict[str, Any] = {"entrypoint_type": EntrypointType.MODULE_PATH, "tags": TAGS, "job_variables": job}
    out = [
        validate.to_deployment(
            NIGHTLY,
            schedules=[Cron(cron, timezone=timezone)],
            parameters={"config": config},
            description=f"The whole pipeline every night ({cron}, {timezone}): record, report, comparison.",
            **common,
        ),
        validate.to_deployment(
            "validate",
            parameters={"config": config},
            description="The whole pipeline on demand; the form picks stages, draft, bench options.",
            **common,
        ),
    ]
    out.append(
        validate.to_deployment(
            "soak",
            schedules=[Cron(SOAK_CRON, timezone=timezone)],
            parameters={"config": config, "stages": {"soak": True}},
            description=f"The whole pipeline with the soak every week ({SOAK_CRON}, {timezone}): hours of steady "
            "load, drift and memory judged; a Retry runs only the windows left.",
            **common,
        )
    )
    for stage in STAGES:
        if stage.name == FINAL:
            continue
        # a stage that is off unless a run asks (capacity, soak): its own deployment asks
        switch = {"stages": {stage.name: True}} if stage.name in StageOptions.model_fields else {}
        out.append(
            validate.to_deployment(
                f"stage-{stage.name}",
                parameters={"config": config, "only": [stage.name], "keep_serving": True, **switch},
                description=f"{stage.name} alone (after preflight), leaving a running service up: {stage.summary}.",
                **common,
            )
        )
    out.append(
        bisect.to_deployment(
            "bisect",
            parameters={"config": config},
            description="Give a REGRESSED or failed run's id: experiments from launch on find which difference "
            "since its last pass did it (config key, image, checkpoint, draft); its record and report section.",
            **common,
        )
    )
    out.append(
        tune.to_deployment(
            "tune",
            parameters={"config": config},
            description="The tutorial's tuning table: give server settings (cells) and bench concurrencies; each cell "
            "is relaunched, proved and measured; the report draws the Pareto frontier. Resume: give an earlier tune.",
            **common,
        )
    )
    out.append(
        clear_cluster.to_deployment(
            "teardown",
            parameters={"config": config},
            description="Remove this config's containers on every node; safe to repeat, needs no lock.",
            **common,
        )
    )
    made = cast("list[RunnerDeployment]", out)
    if cluster:
        for deployment in made:
            deployment.name = f"{deployment.name}-{cluster}"
            deployment.tags = [*deployment.tags, f"cluster:{cluster}"]
    return made


def ensure_pool(name: str = POOL) -> None:
    """A `process` work pool of that name (created with Prefect's default job template if missing)."""
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
            return
    if pool.type != "process":
        raise ValueError(f"work pool {name!r} is of type {pool.type!r}; k3deploy deploys to a process pool")


def apply(
    config: str,
    pool: str = POOL,
    cron: str = NIGHTLY_CRON,
    timezone: str = "UTC",
    runs: Path | None = None,
    cluster: str = "",
) -> dict[str, UUID]:
    """Create or update the pool, every deployment and the cluster's crash automations (deployments/automations.py);
    deployment name → id."""
    cfg = resolve_config(config)
    ensure_pool(pool)
    shared = shared_store() is not None
    made = deployments(config, cron, timezone, runs=runs, cluster=cluster, shared=shared, server=cfg.server)
    ids = {d.name: cast(UUID, d.apply(work_pool_name=pool)) for d in made}
    nightly = [i for name, i in ids.items() if is_nightly(name)]
    alerting = list(ids.values()) if cfg.alerts.every_run else nightly
    ui = PREFECT_UI_URL.value()  # the run's link when the server's own UI URL is not set
    apply_automations(cluster_label(cfg.cluster), cfg.server, cfg.alerts, ids.values(), alerting, ui)
    return ids
