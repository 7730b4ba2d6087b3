"""One transport interface (SSH, local), its result type, and the fan-out over nodes."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

from k3deploy.errors import CommandFailed, K3DeployError, TransportError

Command = str | Sequence[str]
OutputCallback = Callable[[str, str, str], None]
"""Called as (host, "stdout" | "stderr", line) for every complete line, while the command runs."""

KILL_GRACE_S = 3
TIMEOUT_EXIT_CODES = (124, 137)  # coreutils timeout: TERM → 124, KILL after the grace → 137
MAX_CAPTURE = 8 * 1024 * 1024  # per stream; longer output keeps its tail
C = TypeVar("C")
T = TypeVar("T")


@dataclass(frozen=True)
class CommandResult:
    """What one command did on one host."""

    host: str
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> CommandResult:
        """Raise CommandFailed unless the command exited 0."""
        if self.exit_code != 0:
            raise CommandFailed(self.host, self.command, self.exit_code, self.stderr)
        return self


class Transport(Protocol):
    """Runs shell commands on one node. Implementations: SSHTransport, LocalTransport."""

    host: str

    def run(
        self, command: Command, timeout: float, on_output: OutputCallback | None = None, stdin: bytes | None = None
    ) -> CommandResult:
        """Run `command`, killing it on the node once `timeout` seconds pass (CommandTimeout).

        `stdin` is sent to the command, then end-of-file; use it for anything that must not be in argv.
        """
        ...

    def close(self) -> None: ...


def shell_command(command: Command) -> str:
    """An argv list is quoted word by word; a string is taken as a shell command as it is."""
    if isinstance(command, str):
        return command
    if not command:
        raise ValueError("empty command")
    return shlex.join(command)


def with_timeout(command: Command, timeout: float) -> str:
    """Wrap a command so the node itself kills it (and its process group) after `timeout` seconds."""
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return f"timeout -k {KILL_GRACE_S} {timeout:g} sh -c {shlex.quote(shell_command(command))}"


class OutputCollector:
    """Splits streamed bytes into lines for the callback and keeps a bounded copy of each stream."""

    def __init__(self, host: str, on_output: OutputCallback | None, limit: int = MAX_CAPTURE) -> None:
        self.host, self.on_output, self.limit = host, on_output, limit
        self._kept = {"stdout": bytearray(), "stderr": bytearray()}
        self._partial = {"stdout": b"", "stderr": b""}
        self.truncated = {"stdout": False, "stderr": False}

    def feed(self, stream: str, data: bytes) -> None:
        kept = self._kept[stream]
        kept += data
        if len(kept) > self.limit:
            del kept[: len(kept) - self.limit]
            self.truncated[stream] = True
        if self.on_output is None:
            return
        *lines, self._partial[stream] = (self._partial[stream] + data).split(b"\n")
        for line in lines:
            self.on_output(self.host, stream, line.decode(errors="replace"))

    def finish(self) -> tuple[str, str]:
        if self.on_output is not None:
            for stream, rest in self._partial.items():
                if rest:
                    self.on_output(self.host, stream, rest.decode(errors="replace"))
        return tuple(  # type: ignore[return-value]
            ("[… output truncated, tail kept …]\n" if self.truncated[s] else "")
            + self._kept[s].decode(errors="replace")
            for s in ("stdout", "stderr")
        )


def run_all(
    transports: Mapping[str, Transport],
    command: Command | Mapping[str, Command],
    timeout: float,
    on_output: OutputCallback | None = None,
    stdin: bytes | Mapping[str, bytes] | None = None,
) -> dict[str, CommandResult | TransportError]:
    """Run on every node at once; one node's failure never hides another's result.

    `command` (and `stdin`) is the same for all nodes, or a mapping of node name to its own.
    """
    per_node = command if isinstance(command, Mapping) else dict.fromkeys(transports, command)
    missing = set(per_node) - set(transports)
    if missing:
        raise ValueError(f"no transport for node(s): {', '.join(sorted(missing))}")

    def one(name: str) -> CommandResult | TransportError:
        try:
            data = stdin.get(name) if isinstance(stdin, Mapping) else stdin
            return transports[name].run(per_node[name], timeout, on_output, stdin=data)
        except TransportError as err:
            return err

    with ThreadPoolExecutor(max_workers=max(1, len(per_node))) as pool:
        futures = {name: pool.submit(one, name) for name in per_node}
        return {name: future.result() for name, future in futures.items()}


def on_every_node(clients: Mapping[str, C], fn: Callable[[str, C], T], what: str) -> dict[str, T]:
    """Run `fn(node, client)` on all nodes at once; every node's failure is reported, none hidden."""
    with ThreadPoolExecutor(max_workers=max(1, len(clients))) as pool:
        futures = {node: pool.submit(fn, node, client) for node, client in clients.items()}
    results, errors = {}, []
    for node, future in futures.items():
        try:
            results[node] = future.result()
        except K3DeployError as err:
            errors.append(str(err))
    if errors:
        raise K3DeployError(f"{what} failed on {len(errors)} node(s):\n  " + "\n  ".join(errors))
    return results
