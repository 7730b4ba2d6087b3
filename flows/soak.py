"""The soak stage: steady load for `soak.minutes`, in windows, each a real `vllm bench serve` run (tasks/bench/).

Off unless the config's `soak.enabled` or the run's `soak` option asks (the weekly `soak` deployment does). Every
window is judged as it ends and kept in the run's folder: a failed request ends the soak at once naming the
window, and so does a rank that dies, hangs or logs a fatal line (the liveness watch, as in bench). At the end the
last windows are set against the first for latency and throughput drift, and each rank's memory for a leak. A Retry
takes over the windows already judged and runs only the minutes left.
"""

from prefect import flow, runtime
from prefect.logging import get_run_logger

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import ServiceLost, SoakStageFailed
from k3deploy.core.paths import run_folder
from k3deploy.core.stage import FailureClass, Finding, StageResult
from k3deploy.flows.campaign import Event, tell
from k3deploy.tasks.bench.soak import Window, drift, figures
from k3deploy.tasks.bench.soak_windows import Soak, as_dict
from k3deploy.tasks.render import render_plan
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.watch.liveness import watching


@flow(name="soak")
def soak(config: ConfigSource, soak: bool = False, soak_restart: bool = False) -> StageResult:
    """Passes when every window served every request with every rank alive, and nothing drifted beyond its
    tolerance (soak.drift.fails false: drift is flagged, not failed)."""
    cfg = resolve_config(config)
    run = StageRun("soak", SoakStageFailed)
    conf = cfg.soak
    if not (conf.enabled or soak):
        return run.not_applicable("soak.enabled is false and the run did not ask for it (--soak)")
    root = str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id)
    folder = run_folder(root, "soak") / cfg.evidence_key()
    logger = get_run_logger()

    def say(line: str) -> None:  # the log, and the CLI's progress
        logger.info("%s", line)
        tell(Event("progress", "soak", outcome=line))

    concurrency = conf.in_flight(cfg.bench.max_concurrency)
    logger.info("soak: %g min at concurrency %d, %d prompts a window", conf.minutes, concurrency, conf.window_prompts)

    def keep(window: Window) -> None:  # the record has every window judged, however the soak ends
        run.data["windows"] = [as_dict(w) for w in progress.windows]
        run.data["figures"] = figures(progress.windows, [], conf.minutes)
        run.findings.append(Finding(f"window {window.index}", "soak window", window.valid, window.line()
                                    + ("" if window.valid else "; " + "; ".join(window.reasons))))  # fmt: skip

    progress = Soak(on_window=keep)
    run.data = {"folder": str(folder), "concurrency": concurrency, "windows": []}
    with run.guard(), watching(cfg, "soak") as watch:
        try:
            watch.run(progress.measure, cfg, render_plan(cfg), folder, watch.stop, say, soak_restart)
        except ServiceLost as lost:
            where = f"window {progress.running}" if progress.running else "between windows"
            run.findings.append(Finding(where, "soak window", False, f"the service was lost in {where} after "
                                        f"{len(progress.windows)} window(s) judged: {lost.reason}"))  # fmt: skip
            run.data["lost_in_window"] = progress.running
            raise
        run.data["kv_cache_usage_peak"] = watch.kv_peak
    rows = drift(progress.windows, conf.drift) if progress.failure is None else []
    for row in rows:
        ok = row.ok or not conf.drift.fails
        said = row.detail if row.ok or conf.drift.fails else f"{row.detail} (flagged: soak.drift.fails is false)"
        run.findings.append(Finding(row.subject, row.check, ok, said, None if ok else FailureClass.ENGINE))
    shown = figures(progress.windows, rows, conf.minutes)
    run.data |= {"drift": [r.__dict__ for r in rows], "figures": shown}
    run.table("windows", [_row(w) for w in progress.windows], f"soak windows at concurrency {concurrency}")
    run.note(f"saved JSON, output and memory of every window: `{folder}`")
    return run.passed(f"{shown['windows']} window(s), {shown['minutes']:g} of {conf.minutes:g} min, "
                      f"{shown['requests']} requests" + (f"; drifted: {', '.join(shown['drifted'])}"
                                                          if shown["drifted"] else ""))  # fmt: skip


def _row(w: Window) -> dict[str, object]:
    memory = {f"{rank} MiB": None if m.get("bytes") is None else round((m["bytes"] or 0) / 2**20)
              for rank, m in w.memory.items()}  # fmt: skip
    return {"window": w.index, "requests": f"{w.completed}/{w.num_prompts}", "seconds": w.seconds,
            **{k: round(v, 4) for k, v in w.figures.items()}, **memory, "resumed": w.resumed,
            "why": "; ".join(w.reasons) or "-"}  # fmt: skip
