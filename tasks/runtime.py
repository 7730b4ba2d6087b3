"""Where a node's vLLM runs: one interface, a container (docker) or a process (process) per node.

Launch, log following, fail-fast, readiness and teardown are the same code over these primitives:
start (or adopt ours, refuse others), follow the log, wait for the exit, list and remove by labels;
and run a tool beside the server with the server's own vLLM (bench: its version and tokenizer match).
"""

from __future__ import annotations

import contextlib
import json
import queue
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import docker
import docker.errors
import requests

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import K3DeployError
from k3deploy.tasks.containers import ContainerError, Started, labelled, remove_labelled, start_or_adopt
from k3deploy.tasks.live_server import LiveServer, from_inspect, from_proc, proc_read_script
from k3deploy.tasks.render import CONFIG_LABEL, NODE_LABEL, PORTS_LABEL, RUN_LABEL, NodePlan, ProcessSpec, sourced
from k3deploy.tasks.stoppable import run_stoppable, run_stoppable_on
from k3deploy.tasks.transport.base import CommandResult, Transport
from k3deploy.tasks.transport.factory import docker_clients, open_transports

FOREVER_S = 7 * 24 * 3600.0  # a log follow or an exit wait lasts as long as the server does


class Runtime(Protocol):
    """One node's serving runtime."""

    node: str
    follow_ends_on_stop: bool  # log_chunks and wait_exit return soon after `stopping` is set (else: at close)

    def start(self, plan: NodePlan) -> Started:
        """Start the node's server as planned; adopt one of this very config, refuse anything else."""
        ...

    def log_chunks(self, handle: str, stopping: threading.Event) -> Iterator[bytes]:
        """The server's output from its start, as it comes, until it ends (or `stopping`)."""
        ...

    def wait_exit(self, handle: str, stopping: threading.Event) -> str | None:
        """Block until the server exits: how it ended, in words; None once `stopping` is set."""
        ...

    def live(self, handle: str) -> LiveServer | None:
        """What the server really runs, read back: its command line, environment, image, devices; None when
        it has already ended (the exit watch names that)."""
        ...

    def remove(self, labels: Mapping[str, str]) -> list[str]:
        """Stop and remove every server carrying these labels; the names removed."""
        ...

    def memory(self, handle: str) -> int | None:
        """Bytes the server holds now: its process group's resident memory, or its container's memory use; None
        when it has ended or the engine does not say."""
        ...

    def names(self, labels: Mapping[str, str], running_only: bool = False) -> list[str]:
        """Servers carrying these labels: running or not, or only the running ones."""
        ...

    def run_beside(
        self,
        plan: NodePlan,
        command: str,
        timeout: float,
        on_line: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
    ) -> CommandResult:
        """Run a shell command where the node's server runs: in its container, or with its environment;
        killed there (its whole process group) once `stop` is set."""
        ...


EXIT_POLL_S = 1.0  # how soon a container's exit is noticed


class DockerRuntime:
    """A container per node through the Docker API (docker SDK over the node's SSH connection)."""

    follow_ends_on_stop = False  # its log stream ends when the client closes, not before (its exit watch at stop)

    def __init__(self, node: str, client: docker.DockerClient, setup_scripts: Sequence[str] = ()) -> None:
        self.node, self.client, self.setup_scripts = node, client, tuple(setup_scripts)

    def start(self, plan: NodePlan) -> Started:
        assert plan.container is not None, "serve.runtime docker renders a container"
        return start_or_adopt(self.client, self.node, plan.container)

    def log_chunks(self, handle: str, stopping: threading.Event) -> Iterator[bytes]:
        """The log stream (timestamps on), picked up again after a read timeout: a two-hour load is quiet."""
        since: int | None = None
        while not stopping.is_set():
            try:
                yield from self.client.api.logs(handle, stream=True, follow=True, timestamps=True, since=since)
                return
            except requests.exceptions.RequestException:
                since = int(time.time()) - 1  # may repeat a line of the last second; the watcher tolerates it
            except (docker.errors.NotFound, OSError):
                return

    def wait_exit(self, handle: str, stopping: threading.Event) -> str | None:
        """The container's state, read every EXIT_POLL_S, not the engine's wait endpoint: Podman's (4.3, the
        Docker-compatible API) keeps a CPU core busy for each waiter, measured here, which a start must share."""
        while not stopping.wait(EXIT_POLL_S):
            try:
                state = self.client.api.inspect_container(handle).get("State") or {}
            except docker.errors.NotFound:
                return None if stopping.is_set() else "the container exited (status gone (removed))"
            except (requests.exceptions.RequestException, OSError):
                continue  # the connection dropped or closing at stop: ask again (or end, once stopping)
            if not state.get("Running", True) and state.get("Status") not in ("created", "paused"):
                return None if stopping.is_set() else f"the container exited (status {state.get('ExitCode')})"
        return None

    def live(self, handle: str) -> LiveServer | None:
        try:
            attrs = self.client.api.inspect_container(handle)
        except docker.errors.NotFound:
            return None
        try:
            digests = self.client.api.inspect_image(attrs.get("Image") or "").get("RepoDigests") or []
        except docker.errors.APIError:  # removed since (a running container keeps it); the reference alone judges
            digests = []
        return from_inspect(attrs, digests)

    def remove(self, labels: Mapping[str, str]) -> list[str]:
        return remove_labelled(self.client, self.node, labels)

    def memory(self, handle: str) -> int | None:
        try:
            stats = self.client.api.stats(handle, stream=False)
        except (docker.errors.APIError, requests.exceptions.RequestException, OSError):
            return None
        usage = (stats.get("memory_stats") or {}).get("usage")
        return usage if isinstance(usage, int) and usage > 0 else None

    def names(self, labels: Mapping[str, str], running_only: bool = False) -> list[str]:
        return [c.name for c in labelled(self.client, labels) if not running_only or c.status == "running"]

    def run_beside(
        self,
        plan: NodePlan,
        command: str,
        timeout: float,
        on_line: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
    ) -> CommandResult:
        assert plan.container is not None, "serve.runtime docker renders a container"
        entry = sourced(self.setup_scripts, command)  # the same environment the server started with
        name = plan.container.name
        run, signal = (lambda text: self._exec(name, text, on_line)), (lambda text: self._exec(name, text, None))
        return run_stoppable(run, signal, entry, timeout, stop)

    def _exec(self, container: str, text: str, on_line: Callable[[str], None] | None) -> CommandResult:
        started, api = time.monotonic(), self.client.api
        try:
            exec_id = api.exec_create(container, ["sh", "-c", text])["Id"]
            pending, out = "", []
            for chunk in api.exec_start(exec_id, stream=True):
                pending += chunk.decode(errors="replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    out.append(line)
                    if on_line is not None:
                        on_line(line)
            out += [pending] if pending else []
            code = api.exec_inspect(exec_id)["ExitCode"]
        except docker.errors.APIError as err:
            raise ContainerError(self.node, f"cannot run in {container}: {err.explanation or err}") from None
        except (requests.exceptions.RequestException, OSError) as err:  # the node's engine or connection went
            raise ContainerError(self.node, f"cannot run in {container}: {type(err).__name__}: {err}") from None
        output = "\n".join(out)
        return CommandResult(
            self.node, text, -1 if code is None else int(code), output, output, time.monotonic() - started
        )


@dataclass(frozen=True)
class ProcessState:
    """What `ps_script` reports of one process folder."""

    name: str
    alive: bool
    rc: str | None
    labels: dict[str, str]


def ps_script(state_root: str) -> str:
    """One line per process folder: name, alive or dead, exit code, labels JSON (tab-separated)."""
    root = shlex.quote(state_root)
    return (
        f'for d in {root}/*/; do [ -f "$d/labels.json" ] || continue; n=$(basename "$d"); '
        'if [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then a=alive; else a=dead; fi; '
        'r=$(cat "$d/rc" 2>/dev/null || echo -); '
        'printf "%s\\t%s\\t%s\\t%s\\n" "$n" "$a" "$r" "$(tr -d "\\n" <"$d/labels.json")"; done'
    )


def parse_ps(text: str) -> list[ProcessState]:
    out = []
    for line in text.splitlines():
        parts = line.split("\t", 3)
        if len(parts) != 4:
            continue
        name, alive, rc, labels = parts
        try:
            parsed = json.loads(labels)
        except (ValueError, RecursionError):
            parsed = {}
        if not isinstance(parsed, dict):  # `null`, a list: labels no run of ours wrote
            parsed = {}
        out.append(ProcessState(name, alive == "alive", None if rc == "-" else rc, parsed))
    return out


def group_members(pgid: str) -> str:
    """POSIX sh: the live (not zombie) processes of process group `pgid`, one `pid args` line each."""
    keep = "'$2 == g && $3 !~ /^Z/ {$2 = $3 = \"\"; print}'"
    return f"ps -e -o pid= -o pgid= -o stat= -o args= | awk -v g={pgid} {keep}"


def group_rss_script(folder: str) -> str:
    """POSIX sh: the resident KiB of every live process in the group the folder's pid file leads (the server,
    its engine cores, their workers), summed; nothing when it has ended."""
    where = shlex.quote(folder)
    keep = "'$1 == g && $2 !~ /^Z/ {s += $3; n++} END {if (n) print s}'"
    return f'p=$(cat {where}/pid) && kill -0 "$p" 2>/dev/null && ps -e -o pgid= -o stat= -o rss= | awk -v g="$p" {keep}'


def parse_group_rss(text: str) -> int | None:
    """group_rss_script's answer in bytes; None when the group has ended."""
    value = text.strip()
    return int(value) * 1024 if value.isdigit() and int(value) > 0 else None


LEFT_MARK = "k3deploy: still running:"


def port_holders(ports: Sequence[int]) -> str:
    """POSIX sh: one line per port still listened on (/proc/net/tcp{,6}, state 0A), with the pid and command
    of the process holding its socket where this user can see it."""
    owner = (
        'ls -l /proc/[0-9]*/fd 2>/dev/null | awk -v s="socket:[$ino]" '
        '\'/^\\/proc\\//{d=$1} index($0, s){sub(/^\\/proc\\//, "", d); sub(/\\/fd:$/, "", d); print d; exit}\''
    )
    lines = []
    for port in ports:
        listening = f"awk '$4 == \"0A\" && $2 ~ /:{port:04X}$/ {{print $10; exit}}' /proc/net/tcp /proc/net/tcp6"
        lines.append(
            f'ino=$({listening} 2>/dev/null); if [ -n "$ino" ]; then w=$({owner}); '
            'if [ -n "$w" ]; then w="pid $w: $(ps -o args= -p "$w" | cut -c1-100)"; fi; '
            f'echo "port {port} is still listened on (by ${{w:-a process not visible here}})"; fi'
        )
    return "; ".join(lines) or ":"


def stop_script(folder: str, grace_s: float, ports: Sequence[int] = ()) -> str:
    """SIGTERM the process's whole group, SIGKILL it after the grace, and remove its folder only once no
    process of the group is left and nothing listens on its ports: the leader (the wrapper whose pid is
    kept) may be dead while the server it started runs on, and a child that left the group may still hold
    a port. Otherwise print what survives after LEFT_MARK and exit 3, keeping the folder."""
    d = shlex.quote(folder)
    left = group_members('"$p"')
    wait = 'i=0; while [ -n "$({left})" ] && [ "$i" -lt {n} ]; do sleep 0.1; i=$((i+1)); done'
    return "; ".join(
        [
            f'p=$(cat {d}/pid 2>/dev/null); case "$p" in ""|*[!0-9]*) p=;; esac; s=',
            'if [ -n "$p" ]; then kill -TERM "-$p" 2>/dev/null',
            wait.format(left=left, n=int(grace_s * 10)),
            'kill -KILL "-$p" 2>/dev/null',
            wait.format(left=left, n=50),
            f"s=$({left}); fi",
            # a socket can outlive its process's last sight in ps by a moment (seen under load): up to 5 s
            wait.format(left=port_holders(ports), n=50),
            f"h=$({port_holders(ports)})",
            f'if [ -n "$s$h" ]; then echo {shlex.quote(LEFT_MARK)}; [ -z "$s" ] || echo "$s"; [ -z "$h" ] || echo "$h"',
            f"exit 3; fi; rm -rf {d}",
        ]
    )


def label_ports(labels: Mapping[str, str]) -> list[int]:
    """The ports a process's labels.json says it listens on; anything that is not a port is no port of ours."""
    found = [part.strip() for part in labels.get(PORTS_LABEL, "").split(",")]
    return [int(part) for part in found if part.isdigit() and 0 < int(part) < 65536]


class ServersSurvived(K3DeployError):
    """A stop left processes of a server's group alive: the node is not clear."""

    def __init__(self, node: str, removed: list[str], survivors: dict[str, str]) -> None:
        self.node, self.removed, self.survivors = node, removed, survivors
        described = "; ".join(f"{name}: {left}" for name, left in survivors.items())
        super().__init__(f"{node}: still running after SIGTERM and SIGKILL of its process group: {described}")


class ProcessRuntime:
    """vLLM run directly on the node from the serving environment, in a session of its own."""

    follow_ends_on_stop = True  # its tail and exit wait are stopped on the node, through the still open transport

    def __init__(self, node: str, transport: Transport, state_root: str, grace_s: float) -> None:
        self.node, self.transport, self.state_root, self.grace_s = node, transport, state_root, grace_s

    def _states(self) -> list[ProcessState]:
        return parse_ps(self.transport.run(ps_script(self.state_root), timeout=60).check().stdout)

    def _folder(self, name: str) -> str:
        return f"{self.state_root.rstrip('/')}/{name}"

    def start(self, plan: NodePlan) -> Started:
        spec: ProcessSpec | None = plan.process
        assert spec is not None, "serve.runtime process renders a process"
        found = next((s for s in self._states() if s.name == spec.name), None)
        if found is not None:
            ours = found.labels.get(CONFIG_LABEL) == spec.labels.get(CONFIG_LABEL)
            if ours and found.alive:
                return Started(self.node, spec.name, spec.name, adopted=True)
            if not ours and found.alive:
                owner = f"config {found.labels.get(CONFIG_LABEL, '?')}, run {found.labels.get(RUN_LABEL, '?')}"
                raise ContainerError(
                    self.node,
                    f"a process named {spec.name} is already running ({owner}); this config is "
                    f"{spec.labels.get(CONFIG_LABEL)}. Run teardown for its config or stop it by hand.",
                )
            stop = stop_script(spec.state_dir, self.grace_s, label_ports(found.labels))
            stopped = self.transport.run(stop, timeout=60 + self.grace_s)
            stopped.check()  # a dead one of ours: start anew
        self.transport.run(spec.start_script(), timeout=60).check()
        return Started(self.node, spec.name, spec.name, adopted=False)

    def log_chunks(self, handle: str, stopping: threading.Event) -> Iterator[bytes]:
        """`tail -F` of the process's log until it exits; lines arrive through the transport's callback."""
        folder = shlex.quote(self._folder(handle))
        command = f'tail -n +1 -F --pid="$(cat {folder}/pid)" {folder}/log 2>/dev/null'
        lines: queue.Queue[bytes | None] = queue.Queue()

        def follow() -> None:
            try:  # the tail ends on the node when the follow stops, not only when the server does
                run_stoppable_on(
                    self.transport, command, FOREVER_S, stopping, lambda _h, _s, line: lines.put((line + "\n").encode())
                )
            except K3DeployError:
                pass  # the connection went: the exit wait reports what happened
            finally:
                lines.put(None)

        threading.Thread(target=follow, daemon=True).start()
        while (chunk := lines.get()) is not None:
            yield chunk

    def wait_exit(self, handle: str, stopping: threading.Event) -> str | None:
        folder = shlex.quote(self._folder(handle))
        script = (
            f'p=$(cat {folder}/pid 2>/dev/null); while [ -n "$p" ] && kill -0 "$p" 2>/dev/null; do sleep 0.5; done; '
            f"cat {folder}/rc 2>/dev/null || echo gone"
        )
        try:
            result = run_stoppable_on(self.transport, script, FOREVER_S, stopping)
        except K3DeployError as err:
            return None if stopping.is_set() else f"the node stopped answering while the process ran: {err}"
        if stopping.is_set():
            return None
        status = result.stdout.strip()
        if status in ("", "gone"):  # its wrapper, which writes the status, went with it: killed
            return "the process is gone without an exit status (killed)"
        return f"the process exited (status {status})"

    def _mine(self, labels: Mapping[str, str]) -> list[ProcessState]:
        """This node's processes with these labels: nodes sharing a host each see the others' folders."""
        wanted = {**labels, NODE_LABEL: self.node}
        return [s for s in self._states() if all(s.labels.get(k) == v for k, v in wanted.items())]

    def remove(self, labels: Mapping[str, str]) -> list[str]:
        """ServersSurvived when a process of a server's group outlives the stop (its folder is kept)."""
        removed, survivors = [], {}
        for state in self._mine(labels):
            stop = stop_script(self._folder(state.name), self.grace_s, label_ports(state.labels))
            done = self.transport.run(stop, timeout=60 + self.grace_s)
            if LEFT_MARK in done.stdout:
                left = done.stdout.split(LEFT_MARK, 1)[1].strip().splitlines()
                survivors[state.name] = ", ".join(" ".join(line.split())[:120] for line in left[:5])
                continue
            done.check()
            removed.append(state.name)
        if survivors:
            raise ServersSurvived(self.node, removed, survivors)
        return removed

    def names(self, labels: Mapping[str, str], running_only: bool = False) -> list[str]:
        return [s.name for s in self._mine(labels) if not running_only or s.alive]

    def memory(self, handle: str) -> int | None:
        read = self.transport.run(group_rss_script(self._folder(handle)), timeout=60)
        return parse_group_rss(read.stdout) if read.exit_code == 0 else None

    def live(self, handle: str) -> LiveServer | None:
        read = self.transport.run(proc_read_script(self._folder(handle)), timeout=60)
        if read.exit_code != 0:
            why = read.stderr.strip() or "not running"
            raise ContainerError(self.node, f"cannot read back process {handle}: {why}")
        return from_proc(read.stdout)

    def run_beside(
        self,
        plan: NodePlan,
        command: str,
        timeout: float,
        on_line: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
    ) -> CommandResult:
        assert plan.process is not None, "serve.runtime process renders a process"
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.process.environment.items())
        show = None if on_line is None else (lambda _host, _stream, line: on_line(line))
        return run_stoppable_on(self.transport, f"env {assignments} sh -c {shlex.quote(command)}", timeout, stop, show)


@contextlib.contextmanager
def serving_runtimes(cfg: DeploymentConfig) -> Iterator[dict[str, Runtime]]:
    """A runtime per node, node 0 first, by serve.runtime; connections closed however the block ends."""
    if cfg.serve.runtime == "docker":
        with docker_clients(cfg.cluster) as clients:
            scripts = cfg.serve.container.setup_scripts
            yield {node: DockerRuntime(node, client, scripts) for node, client in clients.items()}
        return
    process = cfg.serve.process
    with open_transports(cfg.cluster) as transports:
        grace = process.stop_timeout_s
        yield {node: ProcessRuntime(node, t, process.state_dir, grace) for node, t in transports.items()}


@contextlib.contextmanager
def node_runtime(cfg: DeploymentConfig, node: str) -> Iterator[Runtime]:
    """One node's runtime alone: a node that cannot be reached or trusted fails only itself."""
    if cfg.serve.runtime == "docker":
        with docker_clients(cfg.cluster, only=[node]) as clients:
            yield DockerRuntime(node, clients[node], cfg.serve.container.setup_scripts)
        return
    process = cfg.serve.process
    with open_transports(cfg.cluster) as transports:  # connections open lazily: only this node's is used
        yield ProcessRuntime(node, transports[node], process.state_dir, process.stop_timeout_s)
