"""Host-side checks of the comm stage: hccn.conf, the serving NIC, node 0's ports, driver/firmware.

Same shape as `npu_checks`: argv builders and pure parsers; versions are compared
across nodes by `cross.consistent`.
"""

from __future__ import annotations

from collections.abc import Mapping

from k3deploy.core.stage import Finding
from k3deploy.tasks.batch import first_line, outcome
from k3deploy.tasks.comm.finding import fail, ok
from k3deploy.tasks.node_facts import ToolPaths, driver_version, firmware_version, listening


def hccn_conf_cmd(tools: ToolPaths) -> list[str]:
    return ["cat", tools.hccn_conf]


def ip_link_cmd() -> list[str]:
    return ["ip", "-o", "link", "show"]


def ip_addr_cmd() -> list[str]:
    return ["ip", "-o", "addr", "show"]


# -- /etc/hccn.conf ----------------------------------------------------------------------------------


def hccn_conf_values(text: str) -> dict[str, str]:
    """`key=value` lines (address_N, netmask_N, netdetect_N, gateway_N, ...)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def parse_hccn_conf(
    node: str, text: str, rc: int | None, npus: int, npu_ips: Mapping[int, str | None]
) -> list[Finding]:
    """Per NPU: address_N and netmask_N configured, and address_N is what `-ip -g` reports."""
    if rc != 0:
        return [fail(node, None, "hccn_conf", f"cannot read hccn.conf ({outcome(rc)}): {first_line(text)}")]
    conf = hccn_conf_values(text)
    out = []
    for npu in range(npus):
        address, netmask = conf.get(f"address_{npu}"), conf.get(f"netmask_{npu}")
        if not address or not netmask:
            out.append(fail(node, npu, "hccn_conf", f"address_{npu} / netmask_{npu} missing from hccn.conf"))
        elif npu_ips.get(npu) and npu_ips[npu] != address:
            out.append(fail(node, npu, "hccn_conf", f"address_{npu}={address} but the NPU reports {npu_ips[npu]}"))
        else:
            out.append(ok(node, npu, "hccn_conf", f"address_{npu}={address}"))
    return out


# -- NIC and LOCAL_IP --------------------------------------------------------------------------------


def interfaces(ip_link_text: str) -> dict[str, str]:
    """Interface name → its `ip -o link show` line (`eth0@if7` is named `eth0`)."""
    out = {}
    for line in ip_link_text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":"):  # `ip -o` joins a record's lines with a backslash
            out[parts[1].rstrip(":").split("@")[0]] = line.split("\\")[0].strip()
    return out


def addresses(ip_addr_text: str) -> dict[str, list[str]]:
    """Interface name → its addresses (without prefix length) from `ip -o addr show`."""
    out: dict[str, list[str]] = {}
    for line in ip_addr_text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("inet", "inet6"):
            out.setdefault(parts[1].split("@")[0], []).append(parts[3].split("/")[0])
    return out


def parse_nic(node: str, nic: str, local_ip: str, links: str, addrs: str) -> list[Finding]:
    """`nic`: the configured interface exists; `local_ip`: that interface owns the node's LOCAL_IP."""
    names, owned = interfaces(links), addresses(addrs)
    if nic in names:
        out = [ok(node, None, "nic", names[nic])]
    else:
        out = [fail(node, None, "nic", f"NIC {nic} does not exist on {node}; interfaces: {', '.join(names) or 'none'}")]
    if local_ip in owned.get(nic, []):
        out.append(ok(node, None, "local_ip", f"{nic} owns LOCAL_IP {local_ip}"))
    else:
        holders = [name for name, ips in owned.items() if local_ip in ips]
        where = f"it is on {', '.join(holders)}" if holders else "no interface has it"
        out.append(fail(node, None, "local_ip", f"{nic} does not own LOCAL_IP {local_ip}; {where}"))
    return out


# -- node 0's ports ----------------------------------------------------------------------------------


def parse_free_ports(node: str, text: str, rc: int | None, ports: Mapping[str, int]) -> list[Finding]:
    """One row per named port (service_port, rpc_port): nothing listens on it yet."""
    if rc != 0:
        return [fail(node, None, name, f"ss -Hltn {outcome(rc)}: {first_line(text)}") for name in ports]
    busy = listening(text)
    return [
        fail(node, None, name, f"port {port} is taken: {busy[port]}") if port in busy
        else ok(node, None, name, f"port {port} is free")
        for name, port in ports.items()
    ]  # fmt: skip


# -- driver and firmware -----------------------------------------------------------------------------


def parse_version(node: str, check: str, text: str, rc: int | None) -> tuple[list[Finding], str | None]:
    """The driver_version or firmware_version row and the value (compared across nodes later)."""
    value = driver_version(text) if check == "driver_version" else firmware_version(text)
    if rc != 0 or value is None:
        return [fail(node, None, check, f"no version ({outcome(rc)}): {first_line(text)}")], None
    return [ok(node, None, check, value)], value
