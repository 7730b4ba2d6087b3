"""Cross-node logic: values that must agree on every node, and which NPU pings which address.

HCCL refuses to link NPUs whose TLS switch differs, and a driver mismatch between nodes
fails late and obscurely, so those are compared across the cluster: the majority value
is taken as intended and every node/NPU that differs is named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from k3deploy.core.agreement import majority
from k3deploy.core.stage import Finding
from k3deploy.tasks.comm.finding import fail

Key = tuple[str, int | None]  # (node, NPU or None for a node-wide value)


def _nodes_with(values: Mapping[Key, str], value: str) -> str:
    return ", ".join(dict.fromkeys(node for (node, _), v in values.items() if v == value))


def consistent(rows: Sequence[Finding], values: Mapping[Key, str], what: str) -> list[Finding]:
    """`rows` of one check, those whose value differs from the cluster majority turned into failures."""
    usual = majority(values.values())
    out = []
    for row in rows:
        node = row.node or row.subject  # comm's findings are placed (finding.placed)
        value = values.get((node, row.npu))
        if not row.ok or value is None or value == usual:
            out.append(row)
            continue
        here = node if row.npu is None else f"{node} NPU {row.npu}"
        if usual is None:
            spread = "; ".join(f"{v} on {_nodes_with(values, v)}" for v in sorted(set(values.values())))
            detail = f"{what} {value} on {here}; no majority across nodes ({spread})"
        else:
            detail = f"{what} {value} on {here}, but {usual} on {_nodes_with(values, usual)}"
        out.append(fail(node, row.npu, row.check, detail, row.peer))
    return out


@dataclass(frozen=True)
class PingTarget:
    """Local NPU `npu` pings `peer`'s NPU `peer_npu` at `address` (NIC, or vNIC over HCCS)."""

    npu: int
    peer: str
    peer_npu: int
    address: str
    hccs: bool = False

    @property
    def check(self) -> str:
        return "hccs_ping" if self.hccs else "ping"

    @property
    def key(self) -> str:
        return f"{self.check}:{self.npu}:{self.peer}"


def ping_peers(node: str, nodes: Sequence[str]) -> list[str]:
    """The nodes `node` pings, so that every pair of `nodes` is pinged once and each node sends
    to half of the others (round-robin: the next (n-1)/2, plus the opposite node for half of them).

    An echo request and its reply cross the path both ways, so one ping per pair proves that
    both nodes reach each other; pinging from both ends would double the mesh for nothing.
    """
    n, at = len(nodes), list(nodes).index(node)
    steps = list(range(1, (n - 1) // 2 + 1)) + ([n // 2] if n % 2 == 0 and at < n // 2 else [])
    return [nodes[(at + step) % n] for step in steps]


def ping_plan(node: str, addresses: Mapping[str, Mapping[int, str]], *, hccs: bool = False) -> list[PingTarget]:
    """Every NPU of `node` pings the same-numbered NPU of the peers `ping_peers` gives it.

    Each pair of nodes is pinged once per NPU number, so a bad link on either side shows,
    with about 16 × (N-1) / 2 pings per node rather than 16 × 16 × (N-1). NPUs without a
    known address (absent, or their `-ip -g` failed) are left out: their own rows already
    fail. Ordered peer by peer, so each group of a batch uses distinct NPUs.
    """
    if node not in addresses:
        return []
    mine = addresses[node]
    return [
        PingTarget(npu, peer, npu, addresses[peer][npu], hccs)
        for peer in ping_peers(node, list(addresses))
        for npu in sorted(mine)
        if npu in addresses[peer]
    ]
