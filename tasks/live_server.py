"""What a rank really runs, against what the plan says it runs: command line, environment, image, devices.

A server adopted from an earlier launch, or changed behind k3deploy's back, may run other flags than the
config names; every figure measured on it would then be credited to the wrong settings. The runtimes read
back what is running (the Docker API's inspect; `/proc` of the process); this compares it key by key. Pure.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from k3deploy.tasks.render import NodePlan

# The process runtime's reader: the pid file names the `setsid sh -c` that runs `env … vllm serve …`; its child,
# once `env` has exec'd the server (waited for, 10 s at most), is the server. NUL-separated cmdline and environ,
# each after a marker line, as /proc holds them; `#exited` when the server has already ended (its rc is written).
# A server that ends while it is read (its /proc gone, or a zombie's empty cmdline) is looked at again: `#exited`.
_PROC_READ = """cd {folder} && p=$(cat pid) || exit 3
i=0
while :; do
  c=$(ps -o pid= --ppid "$p" | head -n 1 | tr -d ' ')
  if [ -n "$c" ] && [ "$(tr '\\0' '\\n' <"/proc/$c/cmdline" 2>/dev/null | head -n 1)" != env ] \\
     && cat "/proc/$c/cmdline" >.read-cmdline 2>/dev/null && [ -s .read-cmdline ] \\
     && cat "/proc/$c/environ" >.read-environ 2>/dev/null; then
    echo "#cmdline"; cat .read-cmdline; echo; echo "#environ"; cat .read-environ; rm -f .read-cmdline .read-environ
    exit 0
  fi
  if [ -z "$c" ] && [ -f rc ]; then echo "#exited"; exit 0; fi
  i=$((i + 1)); [ "$i" -lt 50 ] || exit 4
  sleep 0.2
done
"""


@dataclass(frozen=True)
class LiveServer:
    """A rank as running: its argv, its environment, what it runs from (image or environment), its devices."""

    argv: list[str]
    env: dict[str, str]
    source: str | None = None  # the container's image reference; None where the runtime has none to show
    devices: list[str] = field(default_factory=list)  # paths inside the container
    # The engine's own record of the image it runs (repo@sha256:…): inspect shows a tag in `source` when the node
    # also has the image by tag (a `docker pull repo:tag` of the same image), though it runs the planned digest.
    digests: list[str] = field(default_factory=list)


def from_inspect(attrs: dict[str, Any], digests: list[str] | None = None) -> LiveServer:
    """A container as the Docker API's inspect describes it, with its image's repo digests."""
    config = attrs.get("Config") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    devices = [d.get("PathInContainer") or "" for d in (attrs.get("HostConfig") or {}).get("Devices") or []]
    return LiveServer(list(config.get("Cmd") or []), env, config.get("Image"), devices, list(digests or []))


def proc_read_script(state_dir: str) -> str:
    return _PROC_READ.format(folder=shlex.quote(state_dir))


def from_proc(text: str) -> LiveServer | None:
    """The process runtime's reading of `/proc/<server>/cmdline` and `environ` (see proc_read_script); None
    when the server has already exited."""
    if text.startswith("#exited"):
        return None
    _, _, rest = text.partition("#cmdline\n")
    cmdline, _, environ = rest.partition("\n#environ\n")
    argv = [a for a in cmdline.split("\0") if a != ""]
    env = dict(item.split("=", 1) for item in environ.split("\0") if "=" in item)
    return LiveServer(argv, env)


def _command_of(node: NodePlan) -> tuple[list[str], dict[str, str], str | None, list[str]]:
    if node.container is not None:
        c = node.container
        return list(c.command), dict(c.environment), c.image, [inspected_device(d) for d in c.devices]
    assert node.process is not None, "a node plan renders a container or a process"
    return list(node.process.command), dict(node.process.environment), None, []


def inspected_device(spec: str) -> str:
    """`--device host[:container[:perms]]` as inspect shows it: the path inside the container (the engine
    resolves a host path that is a link, e.g. Podman shows the bed's linked devices as /dev/null)."""
    parts = spec.split(":")
    return parts[1] if len(parts) > 1 else parts[0]


def pinned(ref: str | None) -> str | None:
    """`repo:tag@sha256:…` as `repo@sha256:…`: with a digest the tag says nothing (Podman drops it in inspect)."""
    if ref is None or "@" not in ref:
        return ref
    name, _, digest = ref.partition("@")
    last = name.rsplit("/", 1)[-1]
    return f"{name.rsplit(':', 1)[0] if ':' in last else name}@{digest}"


def _unwrapped(argv: list[str], planned: list[str]) -> list[str]:
    """The running argv from where the plan's arguments start. A program runs as what the node makes of it: a
    console script as `python …/bin/vllm serve …`, a site's wrapper as whatever it execs. Which program that
    is, is the environment's to say (its planned variables, PATH and VIRTUAL_ENV, are judged); its arguments
    are the plan's to say, and are judged from the first one on (`serve`)."""
    if not argv or not planned or argv[0] == planned[0] or len(planned) < 2 or planned[1] not in argv[1:]:
        return argv
    return [planned[0], *argv[argv.index(planned[1], 1) :]]


def options(argv: list[str]) -> dict[str, list[str]]:
    """Argv as keys: `--flag` → its values (`[""]` for a switch), positional arguments as `arg N`."""
    out: dict[str, list[str]] = {}
    i, position = 0, 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--") and len(token) > 2:
            name, eq, value = token.partition("=")
            if not eq:
                takes = i + 1 < len(argv) and not argv[i + 1].startswith("--")
                value = argv[i + 1] if takes else ""
                i += 1 if takes else 0
            out.setdefault(name, []).append(value)
        else:
            out[f"arg {position}"] = [token]
            position += 1
        i += 1
    return out


def differences(node: NodePlan, live: LiveServer) -> list[str]:
    """Every key where the running rank differs from its plan: flags, planned environment variables, image,
    devices. Variables the plan does not set (the image's own, the shell's) are not the plan's to judge."""
    argv, env, source, devices = _command_of(node)
    out = []
    planned, running = options(argv), options(_unwrapped(live.argv, argv))
    for key in sorted(planned.keys() | running.keys(), key=lambda k: (k.startswith("arg "), k)):
        want, got = planned.get(key), running.get(key)
        if want != got:
            out.append(f"{_name(key)}: {_values(got)} running, the plan says {_values(want)}")
    for key in sorted(env):
        if live.env.get(key) != env[key]:
            value = "unset" if key not in live.env else repr(live.env[key])
            out.append(f"env {key}: {value} running, the plan says {env[key]!r}")
    if source is not None and pinned(source) not in {pinned(live.source), *live.digests}:
        out.append(f"image: {live.source!r} running, the plan says {source!r}")
    if node.container is not None and sorted(live.devices) != sorted(devices):
        out.append(f"devices: {sorted(live.devices)} running, the plan says {sorted(devices)}")
    return out


def _name(key: str) -> str:
    return key if key.startswith("arg ") else f"flag {key}"


def _values(values: list[str] | None) -> str:
    if values is None:
        return "absent"
    return " ".join(repr(v) if v else "(set)" for v in values)
