"""The comm stage's rows are the stage contract's findings, placed: node, NPU, and the peer node of a ping."""

from __future__ import annotations

from k3deploy.core.stage import Finding


def placed(node: str, npu: int | None, check: str, ok: bool, detail: str, peer: str | None = None) -> Finding:
    """Subject 'node', 'node NPU n' or 'node NPU n → peer', with the parts kept for the report's columns."""
    subject = f"{node}{f' NPU {npu}' if npu is not None else ''}{f' → {peer}' if peer else ''}"
    return Finding(subject, check, ok, detail, node=node, npu=npu, peer=peer)


def ok(node: str, npu: int | None, check: str, detail: str, peer: str | None = None) -> Finding:
    return placed(node, npu, check, True, detail, peer)


def fail(node: str, npu: int | None, check: str, detail: str, peer: str | None = None) -> Finding:
    return placed(node, npu, check, False, detail, peer)
