"""What the models stage concluded, per checkpoint and node: problems named, tables for the artifacts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from k3deploy.blocks.models import DraftSpec
from k3deploy.blocks.serve import ServeConfig
from k3deploy.core.stage import Finding
from k3deploy.tasks.models.checks import (
    QUANT_DESCRIPTION,
    SpaceNeed,
    differing_nodes,
    draft_findings,
    max_len_findings,
    quantization_findings,
    tokenizer_findings,
)
from k3deploy.tasks.models.listing import Listing
from k3deploy.tasks.models.remote import NodeReport

SHOWN = 10  # files named in one problem line before "and N more"


def files_to_fetch(reports: Mapping[str, NodeReport]) -> dict[str, list[str]]:
    """Per node, the files that are missing or failed verification: only these are downloaded."""
    return {node: [c.path for c in report.bad] for node, report in reports.items()}


def space_needs(stats: Mapping[str, Mapping[str, NodeReport]]) -> list[SpaceNeed]:
    """stats: role → node → report."""
    return [
        SpaceNeed(node, r.device, r.missing_bytes, r.free_bytes)
        for per_node in stats.values()
        for node, r in per_node.items()
    ]


def _named(items: list[str]) -> str:
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return "; ".join(items[:SHOWN]) + more


@dataclass
class CheckpointOutcome:
    role: str
    path: str
    listing: Listing
    verified: dict[str, NodeReport]
    fetched: dict[str, NodeReport] = field(default_factory=dict)
    unseen: dict[str, str] = field(default_factory=dict)  # shared storage: nodes that do not see node 0's files
    reused: bool = False  # the verification came from the task cache: an earlier run's, nothing hashed now

    @property
    def final(self) -> dict[str, NodeReport]:
        return {node: self.fetched.get(node, report) for node, report in self.verified.items()}

    def problems(self) -> list[str]:
        """Each node, file and reason that keeps this checkpoint from being served."""
        out = []
        commit = self.listing.commit
        for node, report in self.final.items():
            bad = [f"{c.path}: {c.problem}" for c in report.bad]
            if bad and node in self.fetched:  # what is bad after a download is what could not be downloaded
                out.append(f"{node}: {len(bad)} file(s) of commit {commit} could not be downloaded: {_named(bad)}")
            elif bad:
                was = self.verified[node].previous_commit
                held = f" (its manifest says commit {was})" if was and was != commit else ""
                out.append(f"{node}: {len(bad)} file(s) do not match commit {commit}{held}: {_named(bad)}")
        manifests = {n: r.manifest for n, r in self.final.items() if r.manifest is not None}
        if len(manifests) > 1:
            paths = [f.path for f in self.listing.files]
            out += [
                f"{node}: differs from the other nodes: {why}"
                for node, why in differing_nodes(manifests, paths).items()
            ]
        out += [f"{node}: {why}" for node, why in self.unseen.items()]
        out += [
            f"{fault['peer']}: served {fault['file']} to {node} with bytes that fail the hub's sha256, though its "
            "manifest vouches for it (size and mtime unchanged since verified): its copy is bad, run the models "
            "stage with --full-verify"
            for node, report in self.fetched.items()
            for fault in report.peer_faults
        ]
        return [f"{self.role} {self.path}: {p}" for p in out]

    def received(self, node: str, hub: bool) -> int:
        got = self.fetched[node].received if node in self.fetched else {}
        return sum(n for source, n in got.items() if (source == "hub") == hub)

    def from_each_peer(self, node: str) -> dict[str, int]:
        """Bytes this node received from each peer: a file spreads from every node that verified it."""
        got = self.fetched[node].received if node in self.fetched else {}
        return {source.removeprefix("peer "): n for source, n in sorted(got.items()) if source.startswith("peer ")}

    def received_line(self) -> str:
        """'1.07 GB from the hub, 3.22 GB from peers' over every node, when this run downloaded; else ''."""
        if not self.fetched:
            return ""
        hub, peers = (sum(self.received(n, hub=h) for n in self.fetched) for h in (True, False))
        return f"{hub / 1e9:.2f} GB from the hub, {peers / 1e9:.2f} GB from peers"

    def headline(self) -> str:
        """The stage's one line per checkpoint (the CLI prints it): role, commit, and where the bytes came from."""
        received = self.received_line()
        return f"{self.role} {self.listing.commit[:12]}" + (f" ({received})" if received else "")

    def events(self) -> list[str]:
        """What the download met on each node: a peer gone, bad bytes refused, the hub used instead, a file
        started again from byte 0."""
        lines: list[str] = []
        for node, report in self.fetched.items():
            lines += [f"{node}: {event}" for event in report.events]
            lines += [f"{node}: {check.path}: {check.note}" for check in report.checks if check.note]
        return lines

    def repaired(self) -> list[dict[str, str]]:
        """Files that were on a node but bad (not missing) and were downloaded again: news about that disk."""
        rows = []
        for node, report in self.verified.items():
            fetched = {c.path: c for c in self.fetched[node].checks} if node in self.fetched else {}
            for check in report.bad:
                if check.problem != "missing" and check.path in fetched and fetched[check.path].ok:
                    rows.append({"node": node, "file": check.path, "found": check.problem, "now": "downloaded again"})
        return rows

    def changed_revision(self) -> dict[str, str]:
        """Nodes whose copy was of another commit when this run found it."""
        return {
            node: r.previous_commit
            for node, r in self.verified.items()
            if r.previous_commit and r.previous_commit != self.listing.commit
        }

    def documents(self) -> dict[str, str]:
        """config.json and the quantization description as one node holds them (all verified identical)."""
        merged: dict[str, str] = {}
        for report in [*self.verified.values(), *self.fetched.values()]:
            merged |= report.documents
        return merged

    def config(self) -> dict[str, Any]:
        try:
            data = json.loads(self.documents().get("config.json", "{}"))
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def quant_description(self) -> str | None:
        return self.documents().get(QUANT_DESCRIPTION)

    def manifest_rows(self) -> list[dict[str, Any]]:
        """One row per file: size, checksum, on how many nodes verified, when."""
        final = self.final
        rows = []
        for f in self.listing.files:
            entries = [r.manifest.files[f.path] for r in final.values() if r.manifest and f.path in r.manifest.files]
            rows.append(
                {
                    "file": f.path,
                    "bytes": f.size,
                    "sha256" if f.sha256 else "git blob": f.sha256 or f.git_blob,
                    "verified on": f"{len(entries)}/{len(final)} nodes",
                    "verified at": max((e.verified_at for e in entries), default="never"),
                }
            )
        return rows

    def node_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "checkpoint": self.role,
                "node": node,
                "verified by": "an earlier run (cache hit: sizes and mtimes unchanged)" if self.reused else "this run",
                "hashed files": 0 if self.reused else len(self.verified[node].hashed),
                "downloaded files": sum(c.ok for c in self.fetched[node].checks) if node in self.fetched else 0,
                "from hub bytes": self.received(node, hub=True),
                "from peers bytes": self.received(node, hub=False),
                "from each peer bytes": self.from_each_peer(node),
                "bad files": len(report.bad),
                "verify s": None if self.reused or not report.manifest else report.manifest.verify_seconds,
                "free GB": round(report.free_bytes / 1e9, 1),
            }
            for node, report in self.final.items()
        ]

    def record(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "repo": self.listing.repo,
            "commit": self.listing.commit,
            "path": self.path,
            "files": len(self.listing.files),
            "bytes": self.listing.total_bytes,
            "nodes": self.node_rows(),
            "changed_revision": self.changed_revision(),
            "repaired": self.repaired(),
            "exchange_events": self.events(),
            "problems": self.problems(),
        }


@dataclass
class ModelsOutcome:
    checkpoints: list[CheckpointOutcome]
    findings: list[Finding]

    def record(self) -> dict[str, Any]:
        """Stage data for the run record: each checkpoint's repo, commit, files and nodes, and the checks."""
        return {"checkpoints": [c.record() for c in self.checkpoints], "checks": [vars(f) for f in self.findings]}

    def summary_lines(self) -> list[str]:
        """What was verified where, for the stage summary."""
        lines = []
        for c in self.checkpoints:
            lines.append(
                f"**{c.role}** `{c.listing.repo}` commit `{c.listing.commit}`: {len(c.listing.files)} files, "
                f"{c.listing.total_bytes / 1e9:.2f} GB at `{c.path}`"
            )
            lines += [f"{node} held commit `{was}` before this run" for node, was in c.changed_revision().items()]
            if c.fetched:
                lines.append(f"**{c.role}** received {c.received_line()}")
            if c.reused:
                lines.append(f"**{c.role}**: verified by an earlier run (a cache hit: every file's size and mtime are "
                             "unchanged since); this run hashed none")  # fmt: skip
        return lines

    def problem_findings(self) -> list[Finding]:
        """Every file problem as a failed finding (node and file named in the detail), then the content checks."""
        files = [Finding(c.role, "files", False, p) for c in self.checkpoints for p in c.problems()]
        return files + self.findings


def content_findings(
    outcomes: Mapping[str, CheckpointOutcome], draft: DraftSpec | None, serve: ServeConfig
) -> list[Finding]:
    """The seed FAQ's checks on what the verified checkpoints contain, and what the server will be asked of them."""
    target = outcomes["target"]
    quantized = serve.quantization is not None
    found = tokenizer_findings("target", target.listing, vision="vision_config" in target.config())
    allow_long = serve.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true")
    found += max_len_findings(target.config(), serve.max_model_len, allow_long)
    if quantized:
        found += quantization_findings("target", target.listing, target.quant_description())
    if draft is not None and "draft" in outcomes:
        other = outcomes["draft"]
        found += draft_findings(target.listing, other.listing, target.config(), other.config(), draft)
    return found
