"""The facts preflight reads on every node, pyinfra style: each is data — a name, the command that
reads it, a parser of that command's output and a judge of the value — all pure functions.

A parser raises `Unreadable` when the output does not hold the fact (cut short, non-zero exit,
missing field); `evaluate.py` turns that into a failed fact naming what was read, so a node with
a broken tool is reported, never skipped. The engine fact is read through the docker SDK, not
a command: its parser works on the `version()` dict.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import K3DeployError
from k3deploy.tasks import node_facts as nf
from k3deploy.tasks.batch import first_line, outcome
from k3deploy.tasks.node_facts import ToolPaths

# Column order of the node × fact table.
FACT_NAMES = ("ssh", "os", "kernel", "driver", "firmware", "model_root_free", "shm", "engine", "ports", "mounts",
              "devices")  # fmt: skip
NPU_DEVICE_PREFIX = "/dev/davinci"
LOCAL_HOST_KEY = "local (no SSH)"
_FREE_SPACE_SCRIPT = (
    # The model root may not exist before the models stage: measure its nearest existing parent.
    'p=$1; while [ ! -e "$p" ]; do p=$(dirname -- "$p"); done; printf "path %s\\n" "$p"; exec df -PB1 -- "$p"'
)
_PRESENT_SCRIPT = 'for p; do if [ -e "$p" ]; then echo "present $p"; else echo "missing $p"; fi; done'

Cfg = DeploymentConfig


class Unreadable(K3DeployError, ValueError):
    """The output does not hold the fact; the message says why (exit code, missing field)."""


@dataclass(frozen=True)
class Judgement:
    ok: bool
    detail: str


@dataclass(frozen=True)
class Fact:
    """One command fact: `command` returns None where it does not apply (and says why in `not_applicable`)."""

    name: str
    command: Callable[[Cfg, int], list[str] | None]
    parse: Callable[[str, int | None], Any]
    judge: Callable[[Any, Cfg, int], Judgement]
    label: str = ""  # what an `sh -c` script does, for messages ("df -PB1"); plain commands name themselves
    not_applicable: str = ""

    def source(self, argv: list[str]) -> str:
        """What a failure to read names: the command, or the label and the paths of a script."""
        if argv[:2] == ["sh", "-c"]:
            return " ".join([self.label, *argv[4:]])
        return shlex.join(argv)


# -- shared parsing helpers ------------------------------------------------------------------------


def _require_ok(text: str, rc: int | None) -> str:
    if rc != 0:
        raise Unreadable(f"{outcome(rc)}: {first_line(text)}")
    return text


def human_bytes(n: int) -> str:
    """Decimal units, as df -H and disk vendors count (1.49 TB is a checkpoint's size)."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def parse_df(text: str) -> dict[str, Any]:
    """The data line of `df -PB1 PATH`: size, available bytes and the mount point."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((i for i, line in enumerate(lines) if line.split()[:2] == ["Filesystem", "1-blocks"]), None)
    if header is None or header + 1 >= len(lines):
        raise Unreadable(f"no df -PB1 data line in: {first_line(text)}")
    parts = lines[header + 1].split(None, 5)
    if len(parts) != 6 or not all(p.isascii() and p.isdigit() for p in parts[1:4]):  # "²".isdigit(), int() refuses
        raise Unreadable(f"df line not understood: {lines[header + 1].strip()}")
    return {"filesystem": parts[0], "bytes_total": int(parts[1]), "bytes_available": int(parts[3]),
            "mount": parts[5]}  # fmt: skip


# -- os and kernel ---------------------------------------------------------------------------------


def os_cmd(cfg: Cfg, index: int) -> list[str]:
    return ["cat", "/etc/os-release"]


def parse_os(text: str, rc: int | None) -> str:
    """PRETTY_NAME of /etc/os-release, unquoted as the shell would."""
    for line in _require_ok(text, rc).splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "PRETTY_NAME":
            try:
                words = shlex.split(value, comments=False)
            except ValueError as err:  # an unclosed quote: the output was cut short
                raise Unreadable(f"PRETTY_NAME not understood ({err}): {line.strip()}") from None
            if words and words[0].strip():
                return words[0].strip()
    raise Unreadable("no PRETTY_NAME line")


def kernel_cmd(cfg: Cfg, index: int) -> list[str]:
    return ["uname", "-r"]


def parse_kernel(text: str, rc: int | None) -> str:
    release = _require_ok(text, rc).strip()
    if not release or len(release.split()) != 1 or not release[0].isdigit():
        raise Unreadable(f"not a kernel release: {first_line(text)}")
    return release


def judge_read(value: Any, cfg: Cfg, index: int) -> Judgement:
    """Facts recorded for the run and compared later: read at all is a pass."""
    return Judgement(True, str(value))


# -- NPU driver and firmware -----------------------------------------------------------------------


def npus_configured(cfg: Cfg) -> bool:
    """NPU facts mean something only where the cluster declares NPUs and the servers get NPU devices."""
    if cfg.cluster.npus_per_node == 0:
        return False
    return any(d.split(":", 1)[0].startswith(NPU_DEVICE_PREFIX) for d in cfg.serve.container.devices)


def driver_cmd(cfg: Cfg, index: int) -> list[str] | None:
    return nf.version_info_cmd(ToolPaths()) if npus_configured(cfg) else None


def parse_driver(text: str, rc: int | None) -> str:
    version = nf.driver_version(_require_ok(text, rc))
    if version is None:
        raise Unreadable(f"no Version= line: {first_line(text)}")
    return version


def firmware_cmd(cfg: Cfg, index: int) -> list[str] | None:
    return nf.board_info_cmd(ToolPaths()) if npus_configured(cfg) else None


def parse_firmware(text: str, rc: int | None) -> str:
    version = nf.firmware_version(_require_ok(text, rc))
    if version is None:
        raise Unreadable(f"no 'Firmware Version' line: {first_line(text)}")
    return version


# -- free space at the model root and /dev/shm -----------------------------------------------------


def free_space_argv(path: str) -> list[str]:
    """`df -PB1` of `path`, or of its nearest existing parent, after a `path P` line naming which."""
    return ["sh", "-c", _FREE_SPACE_SCRIPT, "sh", path]


def free_space_cmd(cfg: Cfg, index: int) -> list[str]:
    return free_space_argv(cfg.cluster.model_root)


def parse_free_space(text: str, rc: int | None) -> dict[str, Any]:
    """The path measured (model_root or its nearest existing parent) and its df line."""
    first, _, rest = _require_ok(text, rc).partition("\n")
    if not first.startswith("path /"):
        raise Unreadable(f"no measured path: {first_line(text)}")
    return {"path": first.removeprefix("path ")} | parse_df(rest)


def judge_free_space(value: Mapping[str, Any], cfg: Cfg, index: int) -> Judgement:
    root, path, free = cfg.cluster.model_root, value["path"], value["bytes_available"]
    where = root if path.rstrip("/") == root.rstrip("/") else f"{path} ({root} does not exist yet)"
    detail = f"{human_bytes(free)} free at {where}, on {value['mount']}"
    return Judgement(free > 0, detail if free > 0 else f"no space left: {detail}")


def shm_cmd(cfg: Cfg, index: int) -> list[str]:
    return ["df", "-PB1", "/dev/shm"]


def parse_shm(text: str, rc: int | None) -> dict[str, Any]:
    return parse_df(_require_ok(text, rc))


def judge_shm(value: Mapping[str, Any], cfg: Cfg, index: int) -> Judgement:
    """A /dev/shm of its own with room in it (vLLM's processes share tensors through it)."""
    size, free, mount = value["bytes_total"], value["bytes_available"], value["mount"]
    if mount != "/dev/shm":
        return Judgement(False, f"/dev/shm is not a mount of its own (it is on {mount})")
    if size <= 0 or free <= 0:
        return Judgement(False, f"/dev/shm is full: {human_bytes(free)} free of {human_bytes(size)}")
    return Judgement(True, f"{human_bytes(size)} ({human_bytes(free)} free)")


# -- node 0's ports --------------------------------------------------------------------------------


def wanted_ports(cfg: Cfg) -> dict[str, int]:
    return {"service_port": cfg.serve.service_port, "rpc_port": cfg.serve.rpc_port}


def ports_cmd(cfg: Cfg, index: int) -> list[str] | None:
    return nf.listening_cmd() if index == 0 else None


def parse_ports(text: str, rc: int | None) -> dict[int, str]:
    """Every listening TCP port and its `ss -Hltn` line (nothing listening is an empty map)."""
    return nf.listening(_require_ok(text, rc))


def judge_ports(value: Mapping[int, str], cfg: Cfg, index: int) -> Judgement:
    wanted = wanted_ports(cfg)
    taken = [f"{name} {port} is taken: {value[port]}" for name, port in wanted.items() if port in value]
    if taken:
        return Judgement(False, "; ".join(taken))
    return Judgement(True, ", ".join(f"{name} {port} free" for name, port in wanted.items()))


def judge_ports_held_by_own(value: Mapping[int, str], cfg: Cfg, own: list[str]) -> Judgement:
    """Taken ports while a server of k3deploy's own runs on node 0: launch adopts it when it runs this very
    config and refuses it by name otherwise, so preflight does not stand in its way (nor overrule it)."""
    wanted = wanted_ports(cfg)
    taken = [f"{name} {port}" for name, port in wanted.items() if port in value]
    if not taken:
        return judge_ports(value, cfg, 0)
    return Judgement(
        True,
        f"{', '.join(taken)} held by k3deploy's own {', '.join(own)}: launch adopts it if it runs this config "
        "and refuses it otherwise",
    )


# -- mounts and devices ----------------------------------------------------------------------------


def mount_paths(cfg: Cfg) -> list[str]:
    """Host side of each `host:container[:mode]` bind mount (named volumes have no host path to check)."""
    return [m.split(":", 1)[0] for m in cfg.serve.container.mounts if m.startswith("/")]


def device_paths(cfg: Cfg) -> list[str]:
    """Host side of each `--device host[:container[:perms]]`."""
    return [d.split(":", 1)[0] for d in cfg.serve.container.devices]


def present_argv(paths: list[str]) -> list[str] | None:
    """`present P` or `missing P` per path (test -e); None when there is nothing to look for."""
    return ["sh", "-c", _PRESENT_SCRIPT, "sh", *paths] if paths else None


def mounts_cmd(cfg: Cfg, index: int) -> list[str] | None:
    return present_argv(mount_paths(cfg))


def devices_cmd(cfg: Cfg, index: int) -> list[str] | None:
    return present_argv(device_paths(cfg))


def parse_present(text: str, rc: int | None) -> dict[str, bool]:
    """Path → present, from `present PATH` / `missing PATH` lines."""
    out = {}
    for line in _require_ok(text, rc).splitlines():
        state, _, path = line.partition(" ")
        if state in ("present", "missing") and path.startswith("/"):
            out[path] = state == "present"
    return out


def _judge_paths(kind: str, expected: list[str], value: Mapping[str, bool]) -> Judgement:
    missing = [p for p in expected if value.get(p) is False]
    unreported = [p for p in expected if p not in value]
    problems = ([f"missing {kind}: {', '.join(missing)}"] if missing else []) + (
        [f"not reported (output cut short?): {', '.join(unreported)}"] if unreported else []
    )
    if problems:
        return Judgement(False, "; ".join(problems))
    return Judgement(True, f"all {len(expected)} present")


def judge_mounts(value: Mapping[str, bool], cfg: Cfg, index: int) -> Judgement:
    return _judge_paths("mount path", mount_paths(cfg), value)


def judge_devices(value: Mapping[str, bool], cfg: Cfg, index: int) -> Judgement:
    return _judge_paths("device", device_paths(cfg), value)


# -- the container engine (docker SDK, not a command) ----------------------------------------------


def engine_applies(cfg: Cfg) -> bool:
    """Only the docker runtime has an engine to ask; configs without a runtime field are docker."""
    return getattr(cfg.serve, "runtime", "docker") == "docker"


def parse_engine(info: Mapping[str, Any]) -> dict[str, Any]:
    """Name, version and API version from the docker SDK's `client.version()` (Docker or Podman)."""
    version, api = info.get("Version"), info.get("ApiVersion")
    if not isinstance(version, str) or not version or not isinstance(api, str) or not api:
        raise Unreadable(f"the engine's version answer lacks Version or ApiVersion (keys: {', '.join(sorted(info))})")
    listed = info.get("Components")
    components = [c["Name"] for c in (listed if isinstance(listed, list) else [])
                  if isinstance(c, Mapping) and isinstance(c.get("Name"), str) and c["Name"]]  # fmt: skip
    return {"name": components[0] if components else "Engine", "version": version, "api_version": api,
            "components": components}  # fmt: skip


def judge_engine(value: Mapping[str, Any], cfg: Cfg, index: int) -> Judgement:
    return Judgement(True, f"{value['name']} {value['version']} (API {value['api_version']})")


# -- the list ----------------------------------------------------------------------------------------

_NO_NPU = "no NPU devices configured"
COMMAND_FACTS: tuple[Fact, ...] = (
    Fact("os", os_cmd, parse_os, judge_read),
    Fact("kernel", kernel_cmd, parse_kernel, judge_read),
    Fact("driver", driver_cmd, parse_driver, judge_read, not_applicable=_NO_NPU),
    Fact("firmware", firmware_cmd, parse_firmware, judge_read, not_applicable=_NO_NPU),
    Fact("model_root_free", free_space_cmd, parse_free_space, judge_free_space, "df -PB1"),
    Fact("shm", shm_cmd, parse_shm, judge_shm),
    Fact("ports", ports_cmd, parse_ports, judge_ports, not_applicable="node 0 only"),
    Fact("mounts", mounts_cmd, parse_present, judge_mounts, "test -e", "no mounts configured"),
    Fact("devices", devices_cmd, parse_present, judge_devices, "test -e", "no devices configured"),
)
