"""Running the node agent: the command, the job it reads on stdin, its progress lines and its result."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from k3deploy.core.errors import NodeError
from k3deploy.tasks.models.listing import Listing
from k3deploy.tasks.node import node_agent, node_exchange
from k3deploy.tasks.node.node_agent import FileCheck, Manifest
from k3deploy.tasks.transport.base import CommandResult, OutputCallback, Transport, failed_on, on_each_node

# The agent's modules, in load order: the last one's main(job) runs (it passes the exchange to the first).
AGENT_MODULES = (
    ("k3deploy_node_agent", Path(node_agent.__file__).read_bytes()),
    ("k3deploy_node_exchange", Path(node_exchange.__file__).read_bytes()),
)
SEPARATOR = b"\n#k3deploy-job\n"
if any(SEPARATOR in source for _, source in AGENT_MODULES):
    raise RuntimeError("the node agent's modules must not contain the job separator")
# Reads the agent's modules and its job from stdin, loads each source as a module, runs the last one's main(job).
LOADER = (
    f"import sys,types\n*s,j=sys.stdin.buffer.read().split({SEPARATOR!r})\n"
    f"for n,c in zip({tuple(name for name, _ in AGENT_MODULES)!r},s):\n"
    " m=types.ModuleType(n);sys.modules[n]=m;exec(compile(c,n+'.py','exec'),m.__dict__)\n"
    "sys.exit(m.main(j))"
)


class NodeAgentError(NodeError):
    """The agent could not run on a node, or said something we cannot read."""


def agent_command(python: str) -> list[str]:
    """A short loader; the agent's source and its job travel on stdin (see `agent_input`)."""
    return [python, "-c", LOADER]


def agent_input(job_body: bytes) -> bytes:
    return SEPARATOR.join([*(source for _, source in AGENT_MODULES), job_body])


def job(
    op: str,
    root: str,
    listing: Listing,
    *,
    threads: int = 2,
    urls: Mapping[str, str] | None = None,
    fetch: Iterable[str] = (),
    headers: Mapping[str, str] | None = None,
    read: Iterable[str] = (),
    full: bool = False,
    read_timeout_s: float = 60.0,
    retries: int = 5,
    exchange: Mapping[str, Any] | None = None,
) -> bytes:
    """The JSON job for one node; headers may hold a token, which is why this goes on stdin.
    `full` (verify): hash every file whatever the node's manifest vouches for. `read_timeout_s` (fetch): a hub
    that sends no byte for this long is given up on and the file resumed; `retries`: how many times in a row
    a file is resumed without progress (a stall, a cut, an HTTP 5xx) before it fails. `exchange` (op exchange):
    this node's part of the peer exchange (exchange.exchange_part), the run's token with it."""
    if read_timeout_s <= 0 or retries < 0:
        raise ValueError("read_timeout_s must be > 0 and retries >= 0")
    if op not in ("stat", "verify", "fetch", "exchange"):
        raise ValueError(f"unknown agent op {op!r}")
    if (op == "exchange") != (exchange is not None):
        raise ValueError("the exchange op, and it alone, takes this node's part of the exchange")
    urls = urls or {}
    files = [
        {"path": f.path, "size": f.size, "sha256": f.sha256, "git_blob": f.git_blob, "url": urls.get(f.path, "")}
        for f in listing.files
    ]
    fetch = sorted(fetch)
    if exchange is not None:
        fetch = sorted({*exchange["download"], *exchange["from_peers"]})
    if op in ("fetch", "exchange") and (unknown := [p for p in fetch if not urls.get(p)]):
        raise ValueError(f"no download URL for {', '.join(unknown)}")
    body = {
        "op": op,
        "root": root,
        "repo": listing.repo,
        "commit": listing.commit,
        "files": files,
        "threads": threads,
        "fetch": fetch,
        "headers": dict(headers or {}),
        "read": list(read),
        "full": full,
        "read_timeout_s": read_timeout_s,
        "retries": retries,
    }
    if exchange is not None:
        body["exchange"] = dict(exchange)
    return json.dumps(body).encode()


@dataclass(frozen=True)
class NodeReport:
    """What the agent found on one node for one checkpoint."""

    node: str
    fingerprint: str
    missing_bytes: int
    free_bytes: int
    device: int
    checks: tuple[FileCheck, ...] = ()
    hashed: tuple[str, ...] = ()
    manifest: Manifest | None = None
    documents: dict[str, str] = field(default_factory=dict)
    previous_commit: str | None = None
    received: dict[str, int] = field(default_factory=dict)  # bytes downloaded this run, by source: hub, peer <node>
    events: tuple[str, ...] = ()  # what the peer exchange met: a peer gone, bad bytes refused, the hub instead
    peer_faults: tuple[dict[str, str], ...] = ()  # peers that served bytes failing the hub's sha256

    @property
    def bad(self) -> list[FileCheck]:
        return [c for c in self.checks if not c.ok]


def parse_result(node: str, result: CommandResult) -> NodeReport:
    """The agent's last stdout line, or an error naming the node and what the agent said."""
    lines = result.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if lines else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        tail = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}, no output"])[-1]
        raise NodeAgentError(node, f"the models agent failed: {tail}")
    if "error" in data:
        raise NodeAgentError(node, f"the models agent failed: {data['error']}")
    try:
        manifest = Manifest.from_dict(data["manifest"]) if data.get("manifest") else None
        return NodeReport(
            node=node,
            fingerprint=data["fingerprint"],
            missing_bytes=int(data["missing_bytes"]),
            free_bytes=int(data["free_bytes"]),
            device=int(data["device"]),
            checks=tuple(FileCheck(**c) for c in data.get("checks", [])),
            hashed=tuple(data.get("hashed", [])),
            manifest=manifest,
            documents=dict(data.get("documents", {})),
            previous_commit=data.get("previous_commit"),
            received={str(k): int(v) for k, v in data.get("received", {}).items()},
            events=tuple(str(e) for e in data.get("events", [])),
            peer_faults=tuple({str(k): str(v) for k, v in f.items()} for f in data.get("peer_faults", [])),
        )
    except KeyError as err:  # an agent of another version, or a result cut short
        raise NodeAgentError(node, f"the models agent's result lacks {err}") from None
    except (TypeError, ValueError, AttributeError, OverflowError) as err:
        raise NodeAgentError(node, f"the models agent's result is not readable: {err}") from None


def parse_progress(line: str) -> dict[str, Any] | None:
    """A `K3PROGRESS {json}` line as a dict; anything else is None."""
    if not line.startswith(node_agent.PROGRESS):
        return None
    try:
        data = json.loads(line[len(node_agent.PROGRESS) :])
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _byte_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


class ProgressBoard:
    """Sums every node's agent progress, and per source (hub, peers); calls `report(fraction, text)` at most
    every `every_s` seconds."""

    def __init__(self, report: Callable[[float, str], None], every_s: float = 5.0) -> None:
        self.report, self.every_s = report, every_s
        self.nodes: dict[str, tuple[int, int]] = {}
        self.sources: dict[str, dict[str, int]] = {}  # node → source → bytes received
        self._last = float("-inf")  # the first line is always shown
        self._started = time.monotonic()

    def on_output(self, node: str, stream: str, line: str) -> None:
        data = parse_progress(line) if stream == "stderr" else None
        if data is None or not all(_byte_count(data.get(key)) for key in ("done", "total")):
            return  # not the agent's progress line
        self.nodes[node] = (int(data["done"]), int(data["total"]))
        sources = data.get("sources")
        if isinstance(sources, dict):
            self.sources[node] = {str(k): v for k, v in sources.items() if _byte_count(v)}
        now = time.monotonic()
        if now - self._last >= self.every_s or all(d >= t for d, t in self.nodes.values()):
            self._last = now
            self.report(*self.summary())

    def _split(self, node: str) -> str:
        """' (hub 0.20 GB, peers 0.61 GB)' when a node received from peers; '' when all came from the hub."""
        got = self.sources.get(node, {})
        peers = sum(v for k, v in got.items() if k != "hub")
        return f" (hub {got.get('hub', 0) / 1e9:.2f} GB, peers {peers / 1e9:.2f} GB)" if peers else ""

    def summary(self) -> tuple[float, str]:
        done = sum(d for d, _ in self.nodes.values())
        total = sum(t for _, t in self.nodes.values())
        rate = done / max(time.monotonic() - self._started, 1e-6)
        per_node = ", ".join(f"{n} {d / max(t, 1):.0%}{self._split(n)}" for n, (d, t) in sorted(self.nodes.items()))
        text = f"{done / 1e9:.2f}/{total / 1e9:.2f} GB, {rate / 1e6:.0f} MB/s ({per_node})"
        return (done / total if total else 1.0), text


def run_agent(
    transports: Mapping[str, Transport],
    python: str,
    jobs: Mapping[str, bytes],
    timeout: float,
    what: str,
    on_output: OutputCallback | None = None,
) -> dict[str, NodeReport]:
    """Run one job per node in parallel; each node's report, or one error naming every node that failed."""
    reports, errors = run_agent_each(transports, python, jobs, timeout, on_output)
    if errors:
        raise failed_on(what, errors)
    return reports


def run_agent_each(
    transports: Mapping[str, Transport],
    python: str,
    jobs: Mapping[str, bytes],
    timeout: float,
    on_output: OutputCallback | None = None,
) -> tuple[dict[str, NodeReport], dict[str, str]]:
    """Run one job per node in parallel: the reports of the nodes that finished, the errors of those that did not."""
    command = agent_command(python)

    def one(node: str, transport: Transport) -> NodeReport:
        return parse_result(node, transport.run(command, timeout, on_output, stdin=agent_input(jobs[node])))

    return on_each_node({n: transports[n] for n in jobs}, one)
