"""The smoke stage: real requests against the running service, one row per check (seed section 6).

The checks run under a watch of every rank: one that dies, logs a fatal line or gets stuck fails
the stage within seconds, naming node and DP rank (tasks/watch/liveness.py).
"""

from prefect import flow

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import SmokeStageFailed
from k3deploy.core.stage import StageResult
from k3deploy.tasks.endpoints import service_url
from k3deploy.tasks.smoke.steps import context, served_vision, smoke_checks
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.watch.liveness import watching


@flow(name="smoke")
def smoke(config: ConfigSource) -> StageResult:
    """Chat, streaming, image + text, tool call, reasoning, prefix cache, every DP rank: each passes or says why not."""
    cfg = resolve_config(config)
    run = StageRun("smoke", SmokeStageFailed)
    with run.guard(), watching(cfg, "smoke") as watch:
        ctx = context(cfg, served_vision(cfg))
        rows = watch.run(smoke_checks, cfg, ctx, watch.stop)
    url = service_url(cfg)
    run.findings = [r.finding(url) for r in rows]
    run.table("checks", [r.as_dict() for r in rows], f"smoke checks against {url}")
    run.data = {"base_url": url, "checks": [r.as_dict() | r.outcome.data for r in rows]}
    for r in rows:
        if r.outcome.ok is None:
            run.note(f"{r.check}: not applicable: {r.outcome.detail}")
    counts = {verdict: sum(r.verdict == verdict for r in rows) for verdict in ("pass", "fail", "not-applicable")}
    return run.passed(", ".join(f"{n} {verdict}" for verdict, n in counts.items() if n))
