"""The striped download's plan: who fetches which file from the hub, who from which peer, who serves whom.

One copy through the site's uplink: each file some node lacks is downloaded from the hub by one node (the
files split into stripes of about equal bytes over the nodes that lack them), and every other node that
lacks it fetches it from a peer: its holders first (those that hold it verified already, or else its hub
downloader), then the other nodes that lack it, once they have it (a file spreads from every node that
verified it). Each file also has a rescue order, its receivers in turn from a different one per file: the
first of them still there fetches the file from the hub when no peer can give it fast enough (its holder
failed at the hub, went away, or sends too slowly), and the others take it from that node. Pure:
node_exchange.py runs the plan on the nodes.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from shlex import quote
from typing import Any

from k3deploy.tasks.models.listing import Listing
from k3deploy.tasks.node.node_exchange import PIDFILE

GRACE_S = 60.0  # how long a node waits for a peer's exchange to first answer (its agent may still be starting)


@dataclass(frozen=True)
class NodePart:
    """One node's part: its stripe from the hub, the files it fetches from peers (holders in the order to try),
    the files it holds verified already (it serves them from the start), and the peers that fetch from it."""

    download: tuple[str, ...] = ()
    from_peers: Mapping[str, tuple[str, ...]] | None = None
    serve: tuple[str, ...] = ()
    serve_to: tuple[str, ...] = ()
    rescue: Mapping[str, tuple[str, ...]] | None = None  # file → who fetches it from the hub if no peer can

    @property
    def fetches(self) -> bool:
        return bool(self.download or self.from_peers)


def stripe_plan(listing: Listing, wanted: Mapping[str, Sequence[str]]) -> dict[str, NodePart]:
    """`wanted`: every node of the exchange → the files it lacks (missing or bad). Largest file first, each
    file's hub download goes to the node, of those lacking it, with the fewest hub bytes so far."""
    nodes = list(wanted)
    lacking = {n: set(paths) for n, paths in wanted.items()}
    hub_bytes = dict.fromkeys(nodes, 0)
    download: dict[str, list[str]] = {n: [] for n in nodes}
    from_peers: dict[str, dict[str, tuple[str, ...]]] = {n: {} for n in nodes}
    rescue: dict[str, tuple[str, ...]] = {}
    for rank, f in enumerate(sorted(listing.files, key=lambda f: (-f.size, f.path))):
        lack = [n for n in nodes if f.path in lacking[n]]
        if not lack:
            continue
        holders = [n for n in nodes if f.path not in lacking[n]]
        if not holders:
            chosen = min(lack, key=lambda n: (hub_bytes[n], nodes.index(n)))
            download[chosen].append(f.path)
            hub_bytes[chosen] += f.size
            holders = [chosen]
        receivers = [n for n in lack if n not in holders]
        if receivers:
            turn = rank % len(receivers)
            rescue[f.path] = tuple(receivers[turn:] + receivers[:turn])
        for n in receivers:
            from_peers[n][f.path] = (*holders, *(m for m in receivers if m != n))
    # every node serves until every node that fetches is done: a holder the hub fails takes its file from any peer
    fetching = [n for n in nodes if download[n] or from_peers[n]]
    serve_to = {n: [m for m in fetching if m != n] for n in nodes}
    all_paths = [f.path for f in listing.files]
    return {
        n: NodePart(
            download=tuple(download[n]),
            from_peers=_in_holders_order(from_peers[n], download),
            serve=tuple(p for p in all_paths if p not in lacking[n]),
            serve_to=tuple(serve_to[n]),
            rescue={p: rescue[p] for p in from_peers[n]},
        )
        for n in nodes
    }


def _in_holders_order(
    wanted: Mapping[str, tuple[str, ...]], download: Mapping[str, list[str]]
) -> dict[str, tuple[str, ...]]:
    """Files from peers in the order their first holder downloads them (held files first): pipelined."""

    def rank(path: str) -> int:
        first = download[wanted[path][0]]
        return first.index(path) + 1 if path in first else 0

    return {path: wanted[path] for path in sorted(wanted, key=rank)}


def new_token() -> str:
    """The run's one-time exchange token: in the jobs (stdin) only, never in a command, log or record."""
    return secrets.token_urlsafe(32)


def exchange_part(
    node: str,
    part: NodePart,
    addresses: Mapping[str, str],
    port: int,
    token: str,
    grace_s: float = GRACE_S,
    slow_fraction: float = 0.5,
    stall_s: float = 10.0,
) -> dict[str, Any]:
    """What node_exchange reads from the job: where to listen (the node's cluster address), its peers' URLs, when
    a peer is too slow to keep (`slow_fraction` of the other sources' rate, or `stall_s` without a byte)."""
    peers = {n: f"http://{_host(a)}:{port}" for n, a in addresses.items() if n != node}
    return {
        "node": node,
        "listen": [addresses[node], port],
        "peers": peers,
        "token": token,
        "download": list(part.download),
        "from_peers": {p: list(s) for p, s in (part.from_peers or {}).items()},
        "serve": list(part.serve),
        "serve_to": list(part.serve_to),
        "rescue": {p: list(order) for p, order in (part.rescue or {}).items()},
        "grace_s": grace_s,
        "slow_fraction": slow_fraction,
        "stall_s": stall_s,
    }


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def stop_command(root: str) -> str:
    """Kill what is left of the exchange at `root` (the agent whose pid the pidfile names, if still ours)."""
    pidfile = quote(f"{root.rstrip('/')}/{PIDFILE}")
    return (
        f"p=$(cat {pidfile} 2>/dev/null) || exit 0; "
        f'if grep -q k3deploy_node_agent "/proc/$p/cmdline" 2>/dev/null; then kill -9 "$p"; fi; rm -f {pidfile}'
    )


def plan_lines(listing: Listing, plan: Mapping[str, NodePart]) -> list[str]:
    """Per node, what it takes from the hub and from peers: for the log, before the bytes move."""
    sizes = {f.path: f.size for f in listing.files}
    lines = []
    for node, part in plan.items():
        peers = part.from_peers or {}
        hub_gb = sum(sizes[p] for p in part.download) / 1e9
        peer_gb = sum(sizes[p] for p in peers) / 1e9
        hub, peer = f"{len(part.download)} file(s) {hub_gb:.2f} GB", f"{len(peers)} {peer_gb:.2f} GB"
        lines.append(f"{node} {hub} from the hub, {peer} from peers")
    return lines
