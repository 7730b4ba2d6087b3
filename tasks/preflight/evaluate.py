"""Judging what gathering brought back: one FactResult per node and fact, and the table's rows (pure).

An unreachable or untrusted node fails `ssh` and leaves its other facts unread; a facts script
that failed as a whole fails every fact it held; a section missing from the output (the
script cut short) fails that fact. Nothing here raises for a node: every outcome is a cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from k3deploy.tasks.batch import SectionOutput
from k3deploy.tasks.preflight.facts import (
    COMMAND_FACTS,
    FACT_NAMES,
    Cfg,
    Fact,
    Unreadable,
    engine_applies,
    judge_engine,
    judge_ports_held_by_own,
    parse_engine,
)

State = Literal["ok", "fail", "n/a", "not read"]


@dataclass(frozen=True)
class FactResult:
    """One cell of the node × fact table: the value read (None when unread) and its state.

    `n/a`: the fact does not apply to this node; `not read`: an earlier failure (SSH) kept it from being read.
    """

    node: str
    fact: str
    state: State
    detail: str
    value: Any = None

    @property
    def ok(self) -> bool:
        return self.state != "fail"

    @property
    def judged(self) -> bool:
        """Checked and judged, so a finding of the stage (n/a and unread cells are not)."""
        return self.state in ("ok", "fail")

    @property
    def cell(self) -> str:
        return {"ok": self.detail, "fail": f"FAIL: {self.detail}"}.get(self.state, f"{self.state} ({self.detail})")


@dataclass
class NodeOutputs:
    """What gathering brought back from one node, before any judging."""

    node: str
    host_key: str | None = None  # "SHA256:…" or LOCAL_HOST_KEY
    host_key_type: str = ""  # ssh-ed25519, ecdsa-sha2-nistp256, …
    ssh_error: str | None = None  # unreachable or untrusted: nothing else was read
    batch_error: str | None = None  # the facts script as a whole failed
    sections: dict[str, SectionOutput] = field(default_factory=dict)
    engine: Mapping[str, Any] | None = None
    engine_error: str | None = None
    own_servers: list[str] | None = None  # node 0's running servers of k3deploy's own, by name


# -- judging one node --------------------------------------------------------------------------------


def evaluate(fact: Fact, cfg: Cfg, index: int, node: str, output: SectionOutput | None) -> FactResult:
    """One command fact of one node: parsed and judged, or failed naming what could not be read."""
    if output is None:
        return FactResult(node, fact.name, "fail", "no output: the facts script was cut short before it")
    try:
        value = fact.parse(output.text, output.rc)
    except Unreadable as err:
        source = fact.source(fact.command(cfg, index) or [])
        return FactResult(node, fact.name, "fail", f"cannot read {source}: {err}")
    verdict = fact.judge(value, cfg, index)
    return FactResult(node, fact.name, "ok" if verdict.ok else "fail", verdict.detail, value)


def evaluate_engine(cfg: Cfg, index: int, got: NodeOutputs) -> FactResult:
    """The engine fact, from the docker SDK's answer (asked apart from the facts script)."""
    if not engine_applies(cfg):
        return FactResult(got.node, "engine", "n/a", "no container runtime")
    if got.engine_error is not None:
        return FactResult(got.node, "engine", "fail", f"no Docker API answer: {got.engine_error}")
    if got.engine is None:
        return FactResult(got.node, "engine", "not read", "no engine answer gathered")
    try:
        value = parse_engine(got.engine)
    except Unreadable as err:
        return FactResult(got.node, "engine", "fail", str(err))
    verdict = judge_engine(value, cfg, index)
    return FactResult(got.node, "engine", "ok" if verdict.ok else "fail", verdict.detail, value)


def evaluate_node(cfg: Cfg, index: int, got: NodeOutputs) -> list[FactResult]:
    """Every fact of one node, in FACT_NAMES order; an unreachable node fails `ssh` and reads nothing else."""
    node = got.node
    if got.ssh_error is not None or got.host_key is None:
        why = got.ssh_error or "no host key seen"
        return [FactResult(node, "ssh", "fail", why)] + [
            FactResult(node, name, "not read", "SSH failed") for name in FACT_NAMES if name != "ssh"
        ]
    ssh_detail = f"{got.host_key_type} {got.host_key}".strip()
    results = {"ssh": FactResult(node, "ssh", "ok", ssh_detail, got.host_key)}
    for fact in COMMAND_FACTS:
        if fact.command(cfg, index) is None:
            results[fact.name] = FactResult(node, fact.name, "n/a", fact.not_applicable)
        elif got.batch_error is not None:
            results[fact.name] = FactResult(node, fact.name, "fail", f"not read: {got.batch_error}")
        else:
            results[fact.name] = evaluate(fact, cfg, index, node, got.sections.get(fact.name))
    results["engine"] = evaluate_engine(cfg, index, got)
    ports = results.get("ports")
    if ports is not None and ports.state == "fail" and ports.value is not None and got.own_servers:
        verdict = judge_ports_held_by_own(ports.value, cfg, got.own_servers)
        results["ports"] = FactResult(node, "ports", "ok" if verdict.ok else "fail", verdict.detail, ports.value)
    return [results[name] for name in FACT_NAMES]


def table_row(node: str, results: list[FactResult]) -> dict[str, str]:
    """One row of the node × fact table artifact: the node, then one cell per fact."""
    return {"node": node, **{r.fact: r.cell for r in results}}


def one_machine_twice(host_keys: dict[str, str], local_key: str) -> dict[str, str]:
    """Node → why it fails when its SSH host key is another node's too: two `cluster.nodes` entries that are one
    machine (an address and its alias), whose ranks would share that machine's NPUs. Local nodes (one machine
    by design, the local profile) have no key of their own and are not compared."""
    by_key: dict[str, list[str]] = {}
    for node, key in host_keys.items():
        if key != local_key:
            by_key.setdefault(key, []).append(node)
    out: dict[str, str] = {}
    for key, nodes in by_key.items():
        for node in nodes if len(nodes) > 1 else ():
            others = ", ".join(n for n in nodes if n != node)
            out[node] = f"the same host key as {others} ({key}): one machine listed as {len(nodes)} nodes"
    return out
