"""Command-line front of the `npu-smi` and `hccn_tool` simulators.

`run_npu_smi` and `run_hccn_tool` are pure: they take the parsed bed map and
faults and return what the tool prints and its exit code. `main` is the only
part that reads files (the bed map and this host's faults under /etc/npu-sim).
"""

from __future__ import annotations

import json
import os
import sys
from collections import namedtuple

from . import formats
from .model import CHIPS_PER_NPU, NPUS_PER_HOST, BedMap, FaultError, Faults, HostEntry

TYPE_CHECKING = False  # not `from typing import`: typing costs ~5 ms per simulator call
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

DEFAULT_SIM_DIR = "/etc/npu-sim"
PING_COUNT = 3
HCCN_COMMANDS = (
    "lldp",
    "link",
    "speed",
    "net_health",
    "netdetect",
    "gateway",
    "ip",
    "tls",
    "vnic",
    "ping",
    "hccs_ping",
)


def _healthy(_host: HostEntry) -> Faults:
    return Faults()


class Result(namedtuple("Result", "rc out err", defaults=("", ""))):
    """What a simulated tool prints and returns."""

    __slots__ = ()
    rc: int
    out: str
    err: str


class Context(namedtuple("Context", "bed host faults peer_faults", defaults=(_healthy,))):
    """Everything a simulated command needs to answer (peer_faults reads another host's faults)."""

    __slots__ = ()
    bed: BedMap
    host: HostEntry
    faults: Faults
    peer_faults: Callable[[HostEntry], Faults]


def _usage(tool: str, msg: str) -> Result:
    return Result(2, err=f"{tool}: {msg} (k3deploy test bed simulator)\n")


NO_ROCE_FAILS = ("ip", "netdetect", "gateway", "ping")


def _no_roce(npu: int, cmd: str) -> Result:
    """A query of the RoCE plane on a site without one: `-ip -g` answers as users saw it on nodes without a
    preset address (hicann/driver cmd.c's text, on stderr); the others get the tool's generic failure
    (`Command execute failed!`, same file). The exit code is unpublished: 1."""
    if cmd == "ip":
        return Result(1, err="Get ipconf failed, because no ip was preset there!\n")
    return Result(1, err="Command execute failed!\n")


def _missing_npu(tool: str, npu: int) -> Result:
    """What a query for an absent device gets: an error and a non-zero exit."""
    if tool == "npu-smi":
        card, chip = divmod(npu, CHIPS_PER_NPU)
        return Result(255, err=f"Error: The device (NPU ID {card}, chip ID {chip}) does not exist.\n")
    return Result(255, err=f"Error: device {npu} does not exist, the logic id is invalid. (ret=-8001)\n")


def _int_opt(args: Sequence[str], flag: str) -> int | None:
    if flag not in args:
        return None
    pos = list(args).index(flag)
    if pos + 1 >= len(args):
        raise ValueError(f"option {flag} needs a value")
    return int(args[pos + 1])


def run_npu_smi(ctx: Context, argv: Sequence[str]) -> Result:
    """Simulate `npu-smi` for the subcommands the deployment checks use."""
    args = list(argv)
    if args == ["-v"]:
        return Result(0, out=f"npu-smi version: {ctx.bed.driver_version}\n")
    if not args or args[0] != "info":
        return _usage("npu-smi", f"unsupported arguments {args!r}")
    rest = args[1:]
    if not rest:
        return Result(0, out=formats.npu_smi_info(ctx.bed, ctx.host, ctx.faults))
    if rest == ["-l"]:
        return Result(0, out=formats.npu_smi_list(ctx.faults))
    if rest == ["-m"]:
        return Result(0, out=formats.npu_smi_map(ctx.faults))
    try:
        kind = rest[rest.index("-t") + 1] if "-t" in rest else None
        card = _int_opt(rest, "-i")
        chip = _int_opt(rest, "-c")
    except (ValueError, IndexError) as exc:
        return _usage("npu-smi", str(exc))
    if kind not in ("spod-info", "board") or card is None:
        return _usage("npu-smi", f"unsupported arguments {args!r}")
    if kind == "spod-info" and chip is None:
        return _usage("npu-smi", "spod-info needs -c CHIP")
    chip = chip or 0
    if not (0 <= card < NPUS_PER_HOST // CHIPS_PER_NPU and 0 <= chip < CHIPS_PER_NPU):
        return _missing_npu("npu-smi", card * CHIPS_PER_NPU + chip)
    npu = card * CHIPS_PER_NPU + chip
    if npu in ctx.faults.missing_npus:
        return _missing_npu("npu-smi", npu)
    if kind == "spod-info":
        return Result(0, out=formats.npu_smi_spod_info(ctx.bed, ctx.host, npu))
    return Result(0, out=formats.npu_smi_board(ctx.bed, npu))


def _pairs(tail: Sequence[str]) -> dict[str, str]:
    if len(tail) % 2:
        raise ValueError(f"dangling argument {tail[-1]!r}")
    return {tail[k]: tail[k + 1] for k in range(0, len(tail), 2)}


def ping_replies(ctx: Context, npu: int, address: str, count: int) -> int:
    """How many of `count` packets from local NPU `npu` to `address` come back."""
    if npu in ctx.faults.link_down:
        return 0
    owner = ctx.bed.owner_of(address)
    if owner is None:
        return 0
    peer, peer_npu = owner
    peer_faults = ctx.faults if peer.name == ctx.host.name else ctx.peer_faults(peer)
    if peer_npu.id in peer_faults.missing_npus or peer_npu.id in peer_faults.link_down:
        return 0
    mine = ctx.host.npus[npu]
    source = mine.vnic_ip if address == peer_npu.vnic_ip else mine.ip
    kept = (1 - ctx.faults.loss_to(peer.name, address)) * (1 - peer_faults.loss_to(ctx.host.name, source))
    return formats.received(count, 1 - kept)  # loss on the path drops requests one way, replies the other


def run_hccn_tool(ctx: Context, argv: Sequence[str]) -> Result:
    """Simulate `hccn_tool -i N -<cmd> -g [key value ...]` (options in any order)."""
    args = list(argv)
    try:
        npu = _int_opt(args, "-i")
    except ValueError as exc:
        return _usage("hccn_tool", str(exc))
    cmds = [a[1:] for a in args if a.startswith("-") and a[1:] in HCCN_COMMANDS]
    if npu is None or len(cmds) != 1:
        return _usage("hccn_tool", f"expected -i N and one of {['-' + c for c in HCCN_COMMANDS]}, got {args!r}")
    if "-g" not in args:
        return _usage("hccn_tool", "only get (-g) operations are simulated")
    cmd = cmds[0]
    at = args.index("-i")
    tail = [a for k, a in enumerate(args) if k not in (at, at + 1) and a not in ("-g", f"-{cmd}")]
    if not 0 <= npu < NPUS_PER_HOST or npu in ctx.faults.missing_npus:
        return _missing_npu("hccn_tool", npu)
    if ctx.faults.no_roce and cmd in NO_ROCE_FAILS:
        return _no_roce(npu, cmd)
    n = ctx.host.npus[npu]
    simple: dict[str, Callable[[], str]] = {
        "lldp": lambda: formats.hccn_lldp(ctx.host, n),
        "link": lambda: formats.hccn_link(ctx.faults, npu),
        "speed": formats.hccn_speed,
        "net_health": lambda: formats.hccn_net_health(ctx.faults, npu),
        "netdetect": lambda: formats.hccn_netdetect(n),
        "gateway": lambda: formats.hccn_gateway(n),
        "ip": lambda: formats.hccn_ip(n),
        "tls": lambda: formats.hccn_tls(ctx.faults, npu),
        "vnic": lambda: formats.hccn_vnic(n),
    }
    if cmd in simple:
        return Result(0, out=simple[cmd]()) if not tail else _usage("hccn_tool", f"unexpected {tail!r}")
    try:
        opts = _pairs(tail)
        count = int(opts.get("cnt", PING_COUNT))
    except ValueError as exc:
        return _usage("hccn_tool", str(exc))
    address = opts.get("address")
    if not address or count < 1:
        return _usage("hccn_tool", f"-{cmd} needs 'address IP' (and cnt >= 1)")
    got = ping_replies(ctx, npu, address, count)
    printer = formats.hccn_ping if cmd == "ping" else formats.hccn_hccs_ping
    return Result(0, out=printer(npu, address, count, got))


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _read_faults(path: str) -> Faults:
    try:
        return Faults.parse(_read(path))
    except FileNotFoundError:
        return Faults()


def load_context(sim_dir: str, hostname: str) -> Context:
    """Read the bed map and this host's faults (peers' faults are read lazily)."""
    bed = BedMap.from_json(json.loads(_read(os.path.join(sim_dir, "bed.json"))))
    host = bed.host(hostname)

    def peer_faults(peer: HostEntry) -> Faults:
        try:
            return _read_faults(peer.faults_path) if peer.faults_path else Faults()
        except FaultError:
            return Faults()

    return Context(bed, host, _read_faults(os.path.join(sim_dir, "faults.json")), peer_faults)


def main(tool: str, argv: Sequence[str]) -> int:
    """Entry point of the installed /usr/local/bin wrappers."""
    sim_dir = os.environ.get("NPU_SIM_DIR", DEFAULT_SIM_DIR)
    try:
        ctx = load_context(sim_dir, os.uname().nodename)
    except FaultError as exc:
        sys.stderr.write(f"{tool}: invalid {os.path.join(sim_dir, 'faults.json')}: {exc}\n")
        return 3
    except (OSError, KeyError, ValueError) as exc:
        sys.stderr.write(f"{tool}: NPU simulator not set up on this host: {exc}\n")
        return 3
    if tool == "npu-smi":
        result = run_npu_smi(ctx, argv)
    elif ctx.faults.hccn_exclusive_s > 0:
        result = _exclusive(os.path.join(sim_dir, "hccn_tool.lock"), ctx.faults.hccn_exclusive_s, ctx, argv)
    else:
        result = run_hccn_tool(ctx, argv)
    sys.stdout.write(result.out)
    sys.stderr.write(result.err)
    return result.rc


# hicann/driver cmd.c prints these when the device is in use (info level, stdout; hccs_ping: error level, stderr);
# the exit code of a busy call is not published: 1 here.
BUSY = "hccn_tool is busy, please try again.\n"
HCCS_BUSY = "The device is occupied. Please try again later.\n"


def _exclusive(lock_path: str, hold_s: float, ctx: Context, argv: Sequence[str]) -> Result:
    """hccn_tool refusing concurrent use: a call while another holds the device is answered busy."""
    import fcntl
    import time

    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Result(1, err=HCCS_BUSY) if "-hccs_ping" in argv else Result(1, out=BUSY)
        time.sleep(hold_s)
        return run_hccn_tool(ctx, argv)
