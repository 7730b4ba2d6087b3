"""`k3deploy deploy`, `k3deploy server …` and `k3deploy cluster …`: running k3deploy as a service (deployments,
its Prefect server, who holds a cluster)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from k3deploy.cli.common import ConfigPath, Format, FormatOption, RunsDir, flow_source, load, out, prefect, set_runs_dir
from k3deploy.core.errors import K3DeployError

if TYPE_CHECKING:
    from k3deploy.cli.server import ServerInfo

commands = typer.Typer()
server_commands = typer.Typer(help="The local Prefect server k3deploy starts when PREFECT_API_URL is not set.")
cluster_commands = typer.Typer(help="Who holds a cluster (one run at a time), and freeing a dead run's hold.")


@commands.command()
def deploy(
    config: Annotated[
        str, typer.Option("--config", "-c", help="A saved DeploymentConfig block, or a YAML path the workers read.")
    ],
    pool: Annotated[str, typer.Option("--pool", help="The process work pool (created if missing).")] = "k3deploy",
    cron: Annotated[str, typer.Option("--cron", help="When the nightly validate runs.")] = "30 1 * * *",
    timezone: Annotated[str, typer.Option("--timezone", help="The cron's time zone (IANA name).")] = "UTC",
    runs_dir: RunsDir = None,
    per_cluster: Annotated[
        bool,
        typer.Option(
            "--per-cluster",
            help="Name the deployments after the config's cluster (nightly-<cluster>, …): one server, a fleet.",
        ),
    ] = False,
) -> None:
    """Create or update the work pool and the deployments: nightly, validate, soak (weekly), stage-<name>, teardown.

    Their runs start in this folder (relative config paths resolve as here) and keep their records in
    this runs store; workers on other hosts need both paths, shared.
    """
    set_runs_dir(runs_dir)
    source = flow_source(config)
    cfg = load(source)
    with prefect() as info:
        from k3deploy.deployments.definitions import apply
        from k3deploy.flows.cluster_lock import cluster_label
        from k3deploy.tasks.transport.sftp_store import shared_store

        cluster = cluster_label(cfg.cluster) if per_cluster else ""
        created = apply(source, pool, cron, timezone, cluster=cluster)
        store = shared_store()
    for name, deployment_id in created.items():
        out.print(f"{name}: {info.ui}/deployments/deployment/{deployment_id}", soft_wrap=True)
    from k3deploy.deployments.automations import crash_alert_name, crash_marker_name
    from k3deploy.flows.cluster_lock import cluster_label

    label, server = cluster_label(cfg.cluster), cfg.server
    out.print(f"crashed runs: a run of these deployments silent for {server.silence_seconds()} s (3 heartbeats of "
              f"{server.heartbeat_seconds} s + server.grace_seconds {server.grace_seconds:g}) is marked Crashed "
              f"(automation '{crash_marker_name(label)}')", soft_wrap=True)  # fmt: skip
    if cfg.alerts.webhook_url is not None:
        which = "every deployment's" if cfg.alerts.every_run else "the nightly deployment's"
        out.print(f"crash alert: {which} Crashed runs are sent to {cfg.alerts.target()}, verdict CRASHED "
                  f"(automation '{crash_alert_name(label)}')", soft_wrap=True)  # fmt: skip
    if store is not None:
        out.print(f"shared store {store.where()}: stage results and runs of every worker; each worker keeps its "
                  "own runs folder ($K3DEPLOY_RUNS_DIR)", soft_wrap=True)  # fmt: skip
    from k3deploy.cli.server import client_authenticated

    auth = " PREFECT_API_AUTH_STRING=…" if client_authenticated() else ""
    out.print(f"start a worker: PREFECT_API_URL={info.url}{auth} prefect worker start --pool {pool}", soft_wrap=True)


@server_commands.command("start")
def server_start(
    host: Annotated[
        str, typer.Option("--host", help="Address to serve on; other than loopback it needs --auth (or --insecure).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port (the next free one if taken).")] = 4200,
    auth: Annotated[
        bool, typer.Option("--auth", help="Basic authentication on the API; its auth string kept in a 0600 file.")
    ] = False,
) -> None:
    """Start k3deploy's Prefect server (every other command starts one on loopback when none runs)."""
    from k3deploy.cli import server

    info = server.recorded()
    if info is not None and auth and info.auth_file is None:
        raise K3DeployError(f"a server without API auth already runs at {info.ui}: `k3deploy server stop` it first")
    if info is None:
        info = server.start(lambda line: out.print(line, soft_wrap=True), host=host, port=port, auth=auth)
    out.print(_server_line(info), soft_wrap=True)


def _server_line(info: ServerInfo) -> str:
    from k3deploy.cli.server import on_loopback

    if info.auth_file:
        guard = f"API auth on (auth string in {info.auth_file})"
    else:
        guard = "no API auth (loopback only)" if on_loopback(info.url) else "no API auth (--insecure)"
    return f"running at {info.ui} (pid {info.pid}); {guard}"


@server_commands.command("status")
def server_status() -> None:
    """Say which Prefect server the CLI uses."""
    from k3deploy.cli import server

    info = server.recorded()
    out.print(_server_line(info) if info else "not running; the next command starts it", soft_wrap=True)


@server_commands.command("stop")
def server_stop() -> None:
    """Stop the local Prefect server k3deploy started (its runs stay in its database)."""
    from k3deploy.cli import server

    info = server.stop()
    out.print(f"stopped the server at {info.ui}" if info else "no k3deploy Prefect server is running")


@cluster_commands.command("status")
def cluster_status(config: ConfigPath, fmt: FormatOption = Format.text) -> None:
    """Say whether the cluster is free, or which run holds it, since when, and whether that run is alive."""
    cluster = load(config).cluster
    with prefect():
        from k3deploy.flows.cluster_lock import cluster_hold

        hold = cluster_hold(cluster)
    if fmt is Format.json:
        typer.echo(json.dumps(hold.to_json(), indent=2))
        return
    if not hold.held:
        out.print(f"cluster {hold.label}: free ({hold.lock})")
        return
    record = hold.record
    who = record.describe() if record else "an unknown holder (no record)"
    out.print(f"cluster {hold.label}: held by {who} ({hold.lock})", soft_wrap=True)
    if record is not None:
        age = record.renewed_age_s()
        state = (hold.run_state or "gone").capitalize() if record.run_id else "no flow run (a CLI run)"
        renewed = "never" if age is None else f"{age:.0f} s ago"
        out.print(f"  flow run: {state}; last renewed {renewed}; lease {record.lease_id}", soft_wrap=True)
    dead = hold.dead_reason()
    out.print(f"  stale: {dead}; `k3deploy cluster release` frees it" if dead else "  alive", soft_wrap=True)


@cluster_commands.command("release")
def cluster_release(
    config: ConfigPath,
    force: Annotated[bool, typer.Option("--force", help="Release even while the holder looks alive.")] = False,
) -> None:
    """Free a hold whose run is dead (ended, or not renewed for longer than its lease); refuses a live one."""
    cluster = load(config).cluster
    with prefect():
        from k3deploy.flows.cluster_lock import release_cluster

        said = release_cluster(cluster, force=force)
    out.print(said, soft_wrap=True)
