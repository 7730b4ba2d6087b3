"""Facts of a node that more than one stage reads: where the Ascend tools are, node 0's listening ports, the
driver and firmware versions. Argv builders and pure parsers of real output (preflight and comm both use them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolPaths:
    """Where the tools live on a node (hccn_tool is often not on PATH on a real A3)."""

    npu_smi: str = "/usr/local/bin/npu-smi"
    hccn_tool: str = "/usr/local/Ascend/driver/tools/hccn_tool"
    hccn_conf: str = "/etc/hccn.conf"
    version_info: str = "/usr/local/Ascend/driver/version.info"


def listening_cmd() -> list[str]:
    return ["ss", "-Hltn"]


def version_info_cmd(tools: ToolPaths) -> list[str]:
    return ["cat", tools.version_info]


def board_info_cmd(tools: ToolPaths) -> list[str]:
    """`npu-smi info -t board -i 0 -c 0`: Software and Firmware Version of board 0."""
    return [tools.npu_smi, "info", "-t", "board", "-i", "0", "-c", "0"]


def listening(ss_text: str) -> dict[int, str]:
    """Port → the first `ss -Hltn` line listening on it."""
    out: dict[int, str] = {}
    for line in ss_text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and (m := re.search(r":(\d+)$", parts[3])):
            out.setdefault(int(m[1]), line.strip())
    return out


def driver_version(text: str) -> str | None:
    """`Version=` of /usr/local/Ascend/driver/version.info."""
    m = re.search(r"^Version=(\S+)", text, re.MULTILINE)
    return m[1] if m else None


def firmware_version(text: str) -> str | None:
    """`Firmware Version : X` of `npu-smi info -t board`."""
    m = re.search(r"^\s*Firmware Version\s*:\s*(\S+)", text, re.MULTILINE)
    return m[1] if m else None
