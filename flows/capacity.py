"""The capacity stage: the highest concurrency at which every SLO holds, found by search (tasks/bench/capacity.py).

Off unless the config's `capacity.enabled` or the run's `capacity` option asks. Each probe is a real `vllm bench
serve` run judged VALID by the bench's rules, then against the SLOs; the search doubles, then bisects, and stops
early on over-saturation or its bounds. Under a watch of every rank, as bench: one that dies stops the probe and
fails the stage naming it. A Retry resumes from the probes already measured in the run's folder.
"""

from prefect import flow, runtime
from prefect.logging import get_run_logger

from k3deploy.blocks.capacity import CapacitySlo
from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import CapacityStageFailed
from k3deploy.core.paths import run_folder
from k3deploy.core.stage import FailureClass, Finding, StageResult
from k3deploy.flows.campaign import Event, tell
from k3deploy.tasks.bench.capacity import Answer, Probe, answer_line
from k3deploy.tasks.bench.capacity_probes import Search, as_dict, probe_row
from k3deploy.tasks.render import render_plan
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.watch.liveness import watching


@flow(name="capacity")
def capacity(config: ConfigSource, capacity: bool = False) -> StageResult:
    """Passes with an answer backed by probes below and above it; fails when a probe is no evidence, nothing
    holds, or the answer is below capacity.min_concurrency."""
    cfg = resolve_config(config)
    run = StageRun("capacity", CapacityStageFailed)
    conf = cfg.capacity
    if not (conf.enabled or capacity):
        return run.not_applicable("capacity.enabled is false and the run did not ask for it (--capacity)")
    root = str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id)
    folder = run_folder(root, "capacity") / cfg.evidence_key()
    search = Search()
    logger = get_run_logger()

    def say(line: str) -> None:  # the log, the CLI's progress, and the probes so far for the record however it ends
        logger.info("%s", line)
        tell(Event("progress", "capacity", outcome=line))
        run.data = {"folder": str(folder), "slo": conf.slo.model_dump(), "probes": [as_dict(p) for p in search.probes]}

    logger.info("capacity: searching for the highest concurrency at %s, from %d up to %d", conf.slo.describe(),
                conf.start, conf.max_concurrency)  # fmt: skip
    with run.guard(), watching(cfg, "capacity") as watch:
        watch.run(search.measure, cfg, render_plan(cfg), folder, watch.stop, say)
    answer = search.answer
    assert answer is not None, "the search ends with an answer unless the watch stopped it (the guard raised)"
    run.findings += [probe_finding(row) for row in search.probes]
    run.findings.append(answer_finding(answer, cfg.capacity.slo, conf.min_concurrency))
    said = f"capacity probes at {conf.slo.describe()}: vllm bench serve, random workload, in the order run"
    run.table("probes", [probe_row(p, answer) for p in search.probes], said)
    run.data = {
        "folder": str(folder),
        "slo": conf.slo.model_dump(),
        "why": answer.why,
        "probes": [as_dict(p) for p in search.probes],
        "figures": {"concurrency": answer.concurrency, "ending": answer.ending, "slo": conf.slo.describe(),
                    "line": answer_line(answer, conf.slo), "below": answer.below.concurrency if answer.below else None,
                    "above": answer.above.concurrency if answer.above else None, "resolution": conf.resolution,
                    "probes": len(search.probes)},
    }  # fmt: skip
    run.note(f"saved JSON and output of every probe: `{folder}`")
    return run.passed(answer_line(answer, conf.slo) + f"; {len(search.probes)} probe(s)")


def probe_finding(p: Probe) -> Finding:
    """A probe that is no evidence (and not a saturation) fails the stage; the others say what they measured."""
    ok = p.holds is not None or p.saturated is not None
    return Finding(f"c{p.concurrency}", "capacity probe", ok, f"{p.outcome}: {p.why}",
                   None if ok else FailureClass.TOOL)  # fmt: skip


def answer_finding(answer: Answer, slo: CapacitySlo, floor: int | None) -> Finding:
    line = f"{answer_line(answer, slo)}: {answer.why}"
    if not answer.passed:
        return Finding("capacity", "capacity found", False, line, FailureClass.ENGINE)
    if floor is not None and answer.concurrency < floor:
        return Finding("capacity", "capacity found", False, f"{line}; below capacity.min_concurrency {floor}",
                       FailureClass.ENGINE)  # fmt: skip
    return Finding("capacity", "capacity found", True, line)
