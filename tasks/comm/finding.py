"""One row of the comm stage: which node (and NPU, and peer for a ping), which check, and the line behind it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["ok", "fail"]


@dataclass(frozen=True)
class Finding:
    """One verdict: which node (and NPU, and peer node for a ping), which check, and the line behind it."""

    node: str
    npu: int | None
    check: str
    verdict: Verdict
    detail: str
    peer: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


def ok(node: str, npu: int | None, check: str, detail: str, peer: str | None = None) -> Finding:
    return Finding(node, npu, check, "ok", detail, peer)


def fail(node: str, npu: int | None, check: str, detail: str, peer: str | None = None) -> Finding:
    return Finding(node, npu, check, "fail", detail, peer)
