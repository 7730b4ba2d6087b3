"""NPU checks of the vLLM-Ascend multi-node guide: the command for each, and what its output means.

Builders return argv lists (the batch quotes every word). Parsers are pure: text and exit
code in, `Finding`s out, the offending output line as the detail. Value extractors
(`npu_ip`, `tls_switch`, ...) feed phase 2 and the cross-node comparisons.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

from k3deploy.core.stage import Finding
from k3deploy.tasks.batch import first_line, outcome
from k3deploy.tasks.comm.finding import fail, ok
from k3deploy.tasks.comm.topology import DIES_PER_BOARD, board_die, logical_id
from k3deploy.tasks.node_facts import ToolPaths

# hccn_tool refuses concurrent use (hicann/driver cmd.c: `hccn_tool is busy, please try again.` on stdout; hccs_ping:
# `The device is occupied. Please try again later.` on stderr): a call that says so is made again (batch.render_script).
BUSY = ("hccn_tool is busy, please try again.", "The device is occupied. Please try again later.")


def npu_smi_info_cmd(tools: ToolPaths) -> list[str]:
    return [tools.npu_smi, "info"]


def hccn_cmd(tools: ToolPaths, npu: int, query: str) -> list[str]:
    """`hccn_tool -i NPU -QUERY -g` for one of the table's hccn_tool queries (never a setting one)."""
    from k3deploy.tasks.comm.checks import HCCN_QUERIES  # the table imports this module: read it when called

    if query not in HCCN_QUERIES:
        raise ValueError(f"unknown hccn_tool query {query!r}")
    return [tools.hccn_tool, "-i", str(npu), f"-{query}", "-g"]


def spod_info_cmd(tools: ToolPaths, npu: int, dies_per_board: int = DIES_PER_BOARD) -> list[str]:
    """`npu-smi info -t spod-info -i BOARD -c DIE` for logical NPU `npu`."""
    board, die = board_die(npu, dies_per_board)
    return [tools.npu_smi, "info", "-t", "spod-info", "-i", str(board), "-c", str(die)]


def ping_cmd(tools: ToolPaths, npu: int, address: str, *, hccs: bool = False) -> list[str]:
    """`hccn_tool -i NPU -ping -g address IP` (RoCE) or `-hccs_ping` (HCCS, to a vNIC address)."""
    ipaddress.IPv4Address(address)  # refuse anything that is not an address before it reaches a shell
    return [tools.hccn_tool, "-i", str(npu), "-hccs_ping" if hccs else "-ping", "-g", "address", address]


# -- npu-smi info ----------------------------------------------------------------------------------

_BOARD_ROW = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*([^|]*?)\s*\|")
# A chip row: `| Chip  Phy-ID | Bus-Id |` on A3 (910_93), `| Chip | Bus-Id |` without Phy-ID elsewhere.
_CHIP_ROW = re.compile(r"^\|\s*(\d+)(?:\s+\d+)?\s*\|\s*[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*\|")
HEALTHY = "OK"


def parse_npu_smi_info(
    node: str, text: str, rc: int | None, npus: int, dies_per_board: int = DIES_PER_BOARD
) -> list[Finding]:
    """One `npu_smi` row per expected NPU: listed, and its Health (per die on A3) is OK."""
    if rc != 0 or "Health" not in text:
        return [fail(node, None, "npu_smi", f"npu-smi info {outcome(rc)}: {first_line(text)}")]
    seen: dict[int, tuple[str, str]] = {}
    board: tuple[int, str, str] | None = None
    out = []
    for line in text.splitlines():
        if "Process id" in line:  # the process table follows; its rows look like chip rows
            break
        if chip := _CHIP_ROW.match(line):
            die = int(chip[1])
            if board is not None and die >= dies_per_board:  # another board type, or a garbled row
                out.append(fail(node, None, "npu_smi", f"chip {die} beyond {dies_per_board} per board: {line.strip()}"))
            elif board is not None:
                seen[logical_id(board[0], die, dies_per_board)] = (board[1], board[2])
            continue
        if row := _BOARD_ROW.match(line):
            board = (int(row[1]), row[3], line.strip())
    for npu in range(npus):
        b, d = board_die(npu, dies_per_board)
        if npu not in seen:
            out.append(fail(node, npu, "npu_smi", f"NPU {npu} (board {b}, die {d}) is not listed by npu-smi info"))
            continue
        health, line = seen[npu]
        verdict = ok if health == HEALTHY else fail
        out.append(verdict(node, npu, "npu_smi", f"health {health}: {line}"))
    return out


# -- hccn_tool queries -------------------------------------------------------------------------------


def _line(text: str, pattern: str) -> re.Match[str] | None:
    return re.search(pattern, text, re.MULTILINE)


def _whole_line(text: str, m: re.Match[str]) -> str:
    """The full output line a match sits on: what a person would grep for."""
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.start())
    return text[start : end if end >= 0 else len(text)].strip()


def _is_ipv4(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _tool_failed(node: str, npu: int, check: str, text: str, rc: int | None) -> list[Finding] | None:
    if rc == 0:
        return None
    return [fail(node, npu, check, f"{outcome(rc)}: {first_line(text)}")]


def _expect(
    node: str, npu: int, check: str, text: str, rc: int | None, pattern: str, good: Callable[[re.Match[str]], bool]
) -> list[Finding]:
    """Find the line the guide looks at; ok when `good` says so; the line (or the whole miss) as detail."""
    if failed := _tool_failed(node, npu, check, text, rc):
        return failed
    m = _line(text, pattern)
    if m is None:
        return [fail(node, npu, check, f"unexpected output: {first_line(text)}")]
    return [(ok if good(m) else fail)(node, npu, check, _whole_line(text, m))]


def parse_lldp(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    """The switch port facing the NPU (`Ifname:`); none means no LLDP neighbour, i.e. not cabled."""
    return _expect(node, npu, "lldp", text, rc, r"^\s*Ifname:\s*(.*)$", lambda m: bool(m[1].strip()))


def parse_link(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    return _expect(node, npu, "link", text, rc, r"^link status:\s*(\S+)", lambda m: m[1] == "UP")


def link_speed(text: str) -> str | None:
    """The port speed of `-speed -g` (`Speed: 100000 Mb/s`), in Mb/s; None for `Speed: Unknown!`."""
    m = _line(text, r"^Speed:\s*(\d+) Mb/s")
    return m[1] if m and int(m[1]) > 0 else None


def parse_speed(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    """A known, non-zero port speed (whether it matches every other NPU is `cross.consistent`'s job)."""
    return _expect(node, npu, "speed", text, rc, r"^Speed:\s*(\S+)", lambda m: link_speed(text) is not None)


def parse_net_health(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    return _expect(
        node, npu, "net_health", text, rc, r"^net health status:\s*(.+?)\s*$", lambda m: m[1].lower() == "success"
    )


def parse_netdetect(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    # Both forms are real: the driver source prints `netdetect addr:`, older releases and guides `netdetect address:`
    return _expect(node, npu, "netdetect", text, rc, r"^netdetect addr(?:ess)?:\s*(\S+)", lambda m: _is_ipv4(m[1]))


def parse_gateway(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    return _expect(node, npu, "gateway", text, rc, r"^default gateway:\s*([^,\s]+)", lambda m: _is_ipv4(m[1]))


def npu_ip(text: str) -> str | None:
    """The NPU's RoCE address from `-ip -g` (`ipaddr:X`)."""
    m = _line(text, r"^ipaddr:\s*(\S+)")
    return m[1] if m and _is_ipv4(m[1]) else None


def parse_ip(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    return _expect(node, npu, "ip", text, rc, r"^ipaddr:\s*(\S+)", lambda m: _is_ipv4(m[1]))


def tls_switch(text: str) -> str | None:
    """The `tls switch[N]` value of `-tls -g` (compared across every NPU of every node)."""
    m = _line(text, r"tls switch\[(\d+)\]")
    return m[1] if m else None


def parse_tls(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    """Readable here; whether it matches the other nodes is `cross.consistent`'s job."""
    return _expect(node, npu, "tls", text, rc, r"tls switch\[(\d+)\]", lambda m: True)


def vnic_ip(text: str) -> str | None:
    """The NPU's vNIC (HCCS) address from `-vnic -g`."""
    m = _line(text, r"^vnic ipaddr:\s*(\S+)")
    return m[1] if m and _is_ipv4(m[1]) else None


def parse_vnic(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    if failed := _tool_failed(node, npu, "vnic", text, rc):
        return failed
    link = _line(text, r"^vnic link status:\s*(\S+)")
    if link and link[1] != "UP":
        return [fail(node, npu, "vnic", _whole_line(text, link))]
    m = _line(text, r"^vnic ipaddr:\s*(\S+)")
    if m is None or not _is_ipv4(m[1]):
        return [fail(node, npu, "vnic", f"no vnic address: {first_line(text)}")]
    return [ok(node, npu, "vnic", _whole_line(text, m))]


# -- spod-info, pings --------------------------------------------------------------------------------


def spod_fields(text: str) -> dict[str, str]:
    """`\\tKey : value` lines of `npu-smi info -t spod-info` as a dict (SDID, Super Pod ID, ...)."""
    return {m[1].strip(): m[2].strip() for m in re.finditer(r"^\s*([A-Za-z][\w ()-]*?)\s*:\s*(.*)$", text, re.M)}


def parse_spod_info(node: str, npu: int, text: str, rc: int | None = 0) -> list[Finding]:
    """SDID and Super Pod ID present (the pod id is compared across nodes)."""
    if failed := _tool_failed(node, npu, "spod_info", text, rc):
        return failed
    fields = spod_fields(text)
    if "SDID" not in fields or "Super Pod ID" not in fields:
        return [fail(node, npu, "spod_info", f"no SDID / Super Pod ID: {first_line(text)}")]
    return [ok(node, npu, "spod_info", f"SDID {fields['SDID']}, Super Pod ID {fields['Super Pod ID']}")]


_PING_SUMMARY = r"^(\d+) packets transmitted, (\d+) received, ([\d.]+)% packets? loss"


def parse_ping(
    node: str, npu: int, text: str, rc: int | None, *, peer: str, peer_npu: int, address: str, hccs: bool = False
) -> list[Finding]:
    """No packet lost from local NPU `npu` to `peer`'s NPU `peer_npu` at `address`."""
    check = "hccs_ping" if hccs else "ping"
    target = f"{peer} NPU {peer_npu} {address}"
    if failed := _tool_failed(node, npu, check, text, rc):
        return [fail(node, npu, check, f"to {target}: {failed[0].detail}", peer)]
    m = _line(text, _PING_SUMMARY)
    if m is None:
        return [fail(node, npu, check, f"to {target}: no ping summary: {first_line(text)}", peer)]
    sent, got = int(m[1]), int(m[2])
    verdict = ok if sent > 0 and got == sent else fail
    return [verdict(node, npu, check, f"to {target}: {_whole_line(text, m)}", peer)]
