"""The preflight stage: every node reachable over SSH with its pinned host key, and what it offers.

Always runs first and is never served from a cache, so no cached result of a later stage can
skip connecting to the nodes and checking their host keys.
"""

from prefect import flow
from pydantic_core import to_jsonable_python

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import PreflightFailed
from k3deploy.core.stage import Finding, StageResult
from k3deploy.tasks.preflight.evaluate import FactResult, one_machine_twice, table_row
from k3deploy.tasks.preflight.facts import FACT_NAMES, LOCAL_HOST_KEY
from k3deploy.tasks.preflight.gather import gather_node_facts
from k3deploy.tasks.preflight.store_reach import store_finding
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.transport.sftp_store import shared_store


def record(run: StageRun, results: dict[str, list[FactResult]]) -> None:
    """Findings (judged facts), the node × fact table and the stage data from every node's facts."""
    rows, values, host_keys = [], {}, {}
    for node, facts in results.items():
        run.findings += [Finding(subject=node, check=f.fact, ok=f.ok, detail=f.detail) for f in facts if f.judged]
        rows.append(table_row(node, facts))
        values[node] = {f.fact: to_jsonable_python(f.value) for f in facts if f.value is not None}
        ssh = next(f for f in facts if f.fact == "ssh")
        if ssh.state == "ok":
            host_keys[node] = ssh.value
            run.note(f"{node} host key {ssh.detail}")
    for node, why in one_machine_twice(host_keys, LOCAL_HOST_KEY).items():
        run.findings.append(Finding(subject=node, check="ssh", ok=False, detail=why))
    run.data = {"nodes": values, "host_keys": host_keys, "table": rows}
    run.table("facts", rows, f"One row per node, one column per fact ({', '.join(FACT_NAMES)}).")


@flow(name="preflight")
def preflight(config: ConfigSource) -> StageResult:
    """Every node reachable with its pinned host key, and its facts read and judged; else fail naming node and fact."""
    run = StageRun("preflight", PreflightFailed)
    with run.guard():
        cfg = resolve_config(config)
        results = gather_node_facts(cfg)
    record(run, results)
    store = store_finding(shared_store(), cfg.store.on_unreachable)
    if store is not None:
        run.findings.append(store)
        run.note(f"{store.subject}: {store.detail}")
    bad = [f for f in run.findings if not f.ok]
    if bad:
        nodes = sorted({f.subject for f in bad if f.subject in results}, key=list(results).index)
        others = dict.fromkeys(f.subject for f in bad if f.subject not in results)  # the shared store
        run.failed(f"{len(bad)} fact(s) failed on {', '.join([*nodes, *others])}")
    return run.passed(f"{len(results)} node(s) reachable with pinned host keys; {len(FACT_NAMES)} facts each")
