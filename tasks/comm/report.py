"""What the comm stage found: one row per node / NPU / check, and the views a flow records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from k3deploy.core.stage import Finding
from k3deploy.tasks.comm.checks import HOST_CHECKS, NPU_CHECKS, NPU_GROUPS

_ORDER = {name: i for i, name in enumerate(HOST_CHECKS + NPU_CHECKS)}


def sort_rows(rows: list[Finding], node_order: list[str]) -> list[Finding]:
    """Node order of the cluster, host rows first, then NPU by NPU in the guide's check order."""
    rank = {name: i for i, name in enumerate(node_order)}
    return sorted(
        rows,
        key=lambda f: (
            rank.get(f.node or f.subject, len(rank)),
            f.npu is not None,
            f.npu or 0,
            _ORDER.get(f.check, len(_ORDER)),
            rank.get(f.peer or "", -1),
        ),
    )


@dataclass(frozen=True)
class NotApplicable:
    """A group of checks that was not run because the configuration rules it out: not a pass, not a failure.

    `reason` names the setting (`cluster.npus_per_node is 0: no NPUs declared`); `brief` is its few
    words for a one-line summary."""

    group: str
    checks: tuple[str, ...]
    reason: str
    brief: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "checks": list(self.checks), "reason": self.reason}


@dataclass(frozen=True)
class CommReport:
    """Every row of one comm run; `failures` is what a flow fails on; `not_applicable` the groups not run."""

    nodes: tuple[str, ...]
    rows: tuple[Finding, ...]
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    not_applicable: tuple[NotApplicable, ...] = ()  # a plain default: a report pickled before it still loads

    @property
    def failures(self) -> tuple[Finding, ...]:
        return tuple(r for r in self.rows if not r.ok)

    @property
    def ok(self) -> bool:
        return not self.failures

    def table_rows(self, *, failures_only: bool = False) -> list[dict[str, str]]:
        """Rows for `prefect.artifacts.create_table_artifact(table=...)` (all strings, fixed columns)."""
        return [
            {
                "node": r.node or r.subject,
                "npu": "" if r.npu is None else str(r.npu),
                "check": r.check,
                "peer": r.peer or "",
                "verdict": "ok" if r.ok else "fail",
                "detail": r.detail,
            }
            for r in (self.failures if failures_only else self.rows)
        ]

    def not_applicable_summary(self) -> str:
        """`NPU checks not applicable (no NPUs declared)`, or the groups by name; '' when every group ran."""
        if not self.not_applicable:
            return ""
        groups = [na.group for na in self.not_applicable]
        what = "NPU checks" if set(groups) >= {g for g, _ in NPU_GROUPS} else ", ".join(groups)
        why = "; ".join(dict.fromkeys(na.brief or na.reason for na in self.not_applicable))
        return f"{what} not applicable ({why})"

    def summary(self) -> str:
        """One line: counts, and for a failure which nodes and checks, worst node first."""
        n, nodes = len(self.rows), len(self.nodes)
        if self.ok:
            host_only = self.not_applicable and all(r.check in HOST_CHECKS for r in self.rows)
            line = f"comm OK: {n} {'host ' if host_only else ''}checks on {nodes} nodes, 0 failed"
            return f"{line}; {self.not_applicable_summary()}" if self.not_applicable else line
        per_node: dict[str, Counter[str]] = {}
        for r in self.failures:
            per_node.setdefault(r.node or r.subject, Counter())[r.check] += 1
        worst = sorted(per_node.items(), key=lambda kv: -sum(kv[1].values()))
        parts = [f"{node}: " + ", ".join(f"{c}×{k}" for c, k in sorted(cnt.items())) for node, cnt in worst]
        return f"comm FAILED: {len(self.failures)} of {n} checks on {nodes} nodes; " + "; ".join(parts)
