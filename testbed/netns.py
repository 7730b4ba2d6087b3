"""The bed's network: one bridge, one network namespace and veth pair per host.

The controller side gets 10.213.0.1/24 on the bridge plus a route sending all of
10.213.0.0/16 onto the bridge, so even a mistaken connect to a simulated NPU
address stays on this machine. Host namespaces get no default route at all.
"""

from __future__ import annotations

import json

from .layout import (
    BRIDGE,
    BRIDGE_IP,
    LINK_PREFIX,
    NETNS_PREFIX,
    PREFIX_LEN,
    SUPERNET,
    host_ip,
    netns_name,
    veth_name,
)
from .procs import run


def ip_batch(commands: list[str], netns: str | None = None) -> None:
    """Run many `ip` commands in one process (`ip [-n NS] -batch`), failing on the first error."""
    if commands:
        run(["ip", *(["-n", netns] if netns else []), "-batch", "-"], input="\n".join(commands) + "\n")


def create_bridge() -> None:
    ip_batch(
        [
            f"link add {BRIDGE} type bridge",
            f"addr add {BRIDGE_IP}/{PREFIX_LEN} dev {BRIDGE}",
            f"link set {BRIDGE} up",
            f"route add {SUPERNET} dev {BRIDGE} scope link",
        ]
    )


def create_hosts(count: int) -> None:
    """Namespaces, veths and addresses for hosts 0..count-1."""
    outside: list[str] = []
    for i in range(count):
        ns, veth = netns_name(i), veth_name(i)
        outside += [
            f"netns add {ns}",
            f"link add {veth} type veth peer name eth0 netns {ns}",
            f"link set {veth} master {BRIDGE} up",
        ]
    ip_batch(outside)
    for i in range(count):
        inside = [
            f"addr add {host_ip(i)}/{PREFIX_LEN} dev eth0",
            "link set eth0 up",
            "link set lo up",
            f"route add {SUPERNET} dev eth0 scope link",
        ]
        ip_batch(inside, netns=netns_name(i))


def list_bed_netns() -> list[str]:
    out = run(["ip", "-j", "netns", "list"], check=False).stdout.strip()
    names = [entry["name"] for entry in json.loads(out)] if out else []
    return [n for n in names if n.startswith(NETNS_PREFIX)]


def list_bed_links() -> list[str]:
    out = run(["ip", "-j", "link", "show"], check=False).stdout.strip()
    names = [entry["ifname"] for entry in json.loads(out)] if out else []
    return [n for n in names if n.startswith(LINK_PREFIX)]


def delete_all() -> list[str]:
    """Remove every bed namespace and link; returns what could not be removed."""
    left: list[str] = []
    for ns in list_bed_netns():
        if run(["ip", "netns", "delete", ns], check=False).returncode != 0:
            left.append(f"netns {ns}")
    # veths vanish with their namespace once no process holds it; delete leftovers anyway
    for link in sorted(list_bed_links(), key=lambda n: n == BRIDGE):
        run(["ip", "link", "delete", link], check=False)
    return left + [f"link {link}" for link in list_bed_links()]
