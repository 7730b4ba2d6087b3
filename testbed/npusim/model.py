"""Data the NPU simulators work from: the bed-wide NPU map and one host's faults.

Both are plain JSON files so that a test (or a person) can read and write them
without importing anything; this module only parses and validates them.
Nothing here does I/O, so the unit tests can build every case in memory.

The simulators start a fresh interpreter for every call (a comm check runs
hundreds), so this package avoids heavy imports (dataclasses, typing, pathlib,
socket): records are immutable named tuples.
"""

from __future__ import annotations

import json
from collections import namedtuple

TYPE_CHECKING = False  # not `from typing import`: typing costs ~5 ms per simulator call
if TYPE_CHECKING:
    from typing import Any

NPUS_PER_HOST = 16
CHIPS_PER_NPU = 2  # Atlas 800 A3: 8 NPU boards x 2 dies = 16 logical NPUs
NETMASK = "255.255.255.0"

# The values `-net_health -g` can print on real hardware (Ascend hccn_tool docs).
NET_HEALTH_VALUES = (
    "Success",
    "Fault",
    "Init",
    "Socket fail",
    "Receive timeout",
    "Unreachable",
    "Detect ip set",
)
FAULT_KEYS = (
    "link_down",
    "net_health",
    "tls_switch",
    "ping_loss",
    "missing_npus",
    "health",
    "hccn_exclusive_s",
    "no_roce",
)


class Npu(namedtuple("Npu", "id ip vnic_ip gateway netmask", defaults=(NETMASK,))):
    """One logical NPU (a die) of a test host and its addresses."""

    __slots__ = ()
    id: int
    ip: str
    vnic_ip: str
    gateway: str
    netmask: str

    @property
    def card(self) -> int:
        """The `npu-smi -i` id (board) this die sits on."""
        return self.id // CHIPS_PER_NPU

    @property
    def chip(self) -> int:
        """The `npu-smi -c` id (die on the board)."""
        return self.id % CHIPS_PER_NPU


class HostEntry(namedtuple("HostEntry", "name index ip faults_path npus")):
    """One test host as the simulators see it."""

    __slots__ = ()
    name: str
    index: int
    ip: str
    faults_path: str
    npus: tuple[Npu, ...]


_BED_FIELDS = "hosts super_pod_id super_pod_size driver_version firmware_version"


class BedMap(namedtuple("BedMap", _BED_FIELDS, defaults=(0, 384, "24.1.rc3.7", "7.5.0.5.220"))):
    """Every host's NPU addresses, so a ping can tell which host owns an IP."""

    __slots__ = ()
    hosts: tuple[HostEntry, ...]
    super_pod_id: int
    super_pod_size: int
    driver_version: str
    firmware_version: str

    def host(self, name: str) -> HostEntry:
        for entry in self.hosts:
            if entry.name == name:
                return entry
        raise KeyError(f"host {name!r} is not in the bed map")

    def owner_of(self, ip: str) -> tuple[HostEntry, Npu] | None:
        """The host and NPU whose NIC or vNIC address is `ip`, if any."""
        for entry in self.hosts:
            for npu in entry.npus:
                if ip in (npu.ip, npu.vnic_ip):
                    return entry, npu
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "super_pod_id": self.super_pod_id,
            "super_pod_size": self.super_pod_size,
            "driver_version": self.driver_version,
            "firmware_version": self.firmware_version,
            "hosts": [
                {
                    "name": h.name,
                    "index": h.index,
                    "ip": h.ip,
                    "faults": h.faults_path,
                    "npus": [
                        {"id": n.id, "ip": n.ip, "vnic_ip": n.vnic_ip, "gateway": n.gateway, "netmask": n.netmask}
                        for n in h.npus
                    ],
                }
                for h in self.hosts
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BedMap:
        hosts = tuple(
            HostEntry(
                name=h["name"],
                index=int(h["index"]),
                ip=h["ip"],
                faults_path=h.get("faults", ""),
                npus=tuple(
                    Npu(
                        id=int(n["id"]),
                        ip=n["ip"],
                        vnic_ip=n["vnic_ip"],
                        gateway=n["gateway"],
                        netmask=n.get("netmask", NETMASK),
                    )
                    for n in h["npus"]
                ),
            )
            for h in data["hosts"]
        )
        return cls(
            hosts=hosts,
            super_pod_id=int(data.get("super_pod_id", 0)),
            super_pod_size=int(data.get("super_pod_size", 384)),
            driver_version=str(data.get("driver_version", "24.1.rc3.7")),
            firmware_version=str(data.get("firmware_version", "7.5.0.5.220")),
        )


class FaultError(ValueError):
    """A faults file that does not follow the documented schema."""


def _npu_ids(value: Any, key: str) -> frozenset[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and 0 <= v < NPUS_PER_HOST for v in value):
        raise FaultError(f"{key}: expected a list of NPU ids 0..{NPUS_PER_HOST - 1}, got {value!r}")
    return frozenset(value)


def _per_npu(value: Any, key: str, default: Any) -> dict[int, Any]:
    """Accept `[ids]` (each gets `default`) or `{"id": value}`."""
    if isinstance(value, list):
        return dict.fromkeys(_npu_ids(value, key), default)
    if isinstance(value, dict):
        out: dict[int, Any] = {}
        for k, v in value.items():
            try:
                npu = int(k)
            except (TypeError, ValueError):
                raise FaultError(f"{key}: NPU id {k!r} is not an integer") from None
            if not 0 <= npu < NPUS_PER_HOST:
                raise FaultError(f"{key}: NPU id {npu} out of range")
            out[npu] = v
        return out
    raise FaultError(f"{key}: expected a list or an object, got {value!r}")


_FAULT_FIELDS = "link_down net_health tls_switch tls_default ping_loss missing_npus health hccn_exclusive_s no_roce"
_NO_FAULTS = (frozenset(), {}, {}, 0, {}, frozenset(), {}, 0.0, False)  # the dicts are never mutated


class Faults(namedtuple("Faults", _FAULT_FIELDS, defaults=_NO_FAULTS)):
    """Faults injected on one host (schema: see the testbed.npusim package docstring)."""

    __slots__ = ()
    link_down: frozenset[int]
    net_health: dict[int, str]
    tls_switch: dict[int, int]
    tls_default: int
    ping_loss: dict[str, float]
    missing_npus: frozenset[int]
    health: dict[int, str]
    hccn_exclusive_s: float  # > 0: hccn_tool refuses a call while another runs, each holding the device this long
    no_roce: bool  # an HCCS-only super-pod site: no RoCE address is configured on any NPU

    def tls_for(self, npu: int) -> int:
        return self.tls_switch.get(npu, self.tls_default)

    def loss_to(self, peer_host: str | None, peer_ip: str) -> float:
        """Share of packets lost from this host to a peer NPU address (0.0..1.0)."""
        if peer_ip in self.ping_loss:
            return self.ping_loss[peer_ip]
        if peer_host is not None and peer_host in self.ping_loss:
            return self.ping_loss[peer_host]
        return 0.0

    @classmethod
    def parse(cls, text: str) -> Faults:
        """Parse a faults file; an empty file or `{}` means no fault."""
        if not text.strip():
            return cls()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FaultError(f"not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise FaultError("the top level must be an object")
        unknown = sorted(set(data) - set(FAULT_KEYS))
        if unknown:
            raise FaultError(f"unknown keys {unknown}; known: {list(FAULT_KEYS)}")
        net_health = {k: str(v) for k, v in _per_npu(data.get("net_health", []), "net_health", "Fault").items()}
        for npu, value in net_health.items():
            if value not in NET_HEALTH_VALUES:
                raise FaultError(f"net_health: NPU {npu}: {value!r} not one of {list(NET_HEALTH_VALUES)}")
        tls = data.get("tls_switch", 0)
        tls_default, tls_map = 0, {}
        if isinstance(tls, bool) or not isinstance(tls, int | dict):
            raise FaultError(f"tls_switch: expected 0, 1 or an object, got {tls!r}")
        if isinstance(tls, int):
            tls_default = tls
        else:
            tls_map = {k: int(v) for k, v in _per_npu(tls, "tls_switch", 1).items()}
        if any(v not in (0, 1) for v in (tls_default, *tls_map.values())):
            raise FaultError("tls_switch: values must be 0 or 1")
        return cls(
            link_down=_npu_ids(data.get("link_down", []), "link_down"),
            net_health=net_health,
            tls_switch=tls_map,
            tls_default=tls_default,
            ping_loss=_parse_loss(data.get("ping_loss", {})),
            missing_npus=_npu_ids(data.get("missing_npus", []), "missing_npus"),
            health={k: str(v) for k, v in _per_npu(data.get("health", {}), "health", "Critical").items()},
            hccn_exclusive_s=_seconds(data.get("hccn_exclusive_s", 0.0), "hccn_exclusive_s"),
            no_roce=_flag(data.get("no_roce", False), "no_roce"),
        )


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise FaultError(f"{key}: expected true or false, got {value!r}")
    return value


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 60:
        raise FaultError(f"{key}: expected seconds between 0 and 60, got {value!r}")
    return float(value)


def _parse_loss(value: Any) -> dict[str, float]:
    """`["node2", "10.213.64.12"]` (all lost) or `{"node2": 0.5}`."""
    if isinstance(value, list):
        value = dict.fromkeys(value, 1.0)
    if not isinstance(value, dict):
        raise FaultError(f"ping_loss: expected a list or an object, got {value!r}")
    out: dict[str, float] = {}
    for peer, share in value.items():
        if not isinstance(peer, str) or isinstance(share, bool) or not isinstance(share, int | float):
            raise FaultError(f"ping_loss: bad entry {peer!r}: {share!r}")
        if not 0.0 <= float(share) <= 1.0:
            raise FaultError(f"ping_loss: {peer}: loss share must be within 0..1")
        out[peer] = float(share)
    return out
