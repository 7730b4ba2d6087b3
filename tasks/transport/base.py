"""One transport interface (SSH, local), its result type, and the fan-out over nodes.

A connection that drops while a command runs leaves its result unknown, so no transport ever runs
a command again by itself. The caller says which commands only read (`run_idempotent`, or
`run_all(..., idempotent=True)`): those are run again on a fresh connection, a bounded number of
times; any other command's drop surfaces as `CommandInterrupted`, naming the node and what it was for.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.logging.loggers import LoggingAdapter

from k3deploy.core.errors import CommandFailed, ConnectionFault, K3DeployError, TransportError

Command = str | Sequence[str]
OutputCallback = Callable[[str, str, str], None]
"""Called as (host, "stdout" | "stderr", line) for every complete line, while the command runs."""

KILL_GRACE_S = 3
TIMEOUT_EXIT_CODES = (124, 137)  # coreutils timeout: TERM → 124, KILL after the grace → 137
MAX_CAPTURE = 8 * 1024 * 1024  # per stream; longer output keeps its tail
BRIEF_CHARS = 80  # of a command, in a message (a batch script is kilobytes; its purpose says what it is)
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


def brief(command: str) -> str:
    """A command's first line, cut to BRIEF_CHARS: enough to recognise it in a message."""
    lines = command.strip().splitlines() or [""]
    first = lines[0]
    cut = len(lines) > 1 or len(first) > BRIEF_CHARS
    return first[:BRIEF_CHARS] + ("…" if cut else "")


class CommandInterrupted(ConnectionFault):
    """The connection dropped after the command was sent: it may have run in part, in full, or not at all.

    (A ConnectionFault, so every caller that handles a lost node handles this too.)
    """

    def __init__(
        self,
        host: str,
        command: str,
        cause: str,
        *,
        purpose: str | None = None,
        attempts: int = 1,
        idempotent: bool = False,
    ) -> None:
        self.command, self.cause, self.purpose = command, cause, purpose
        self.attempts, self.idempotent = attempts, idempotent
        what = f"{purpose} ({brief(command)!r})" if purpose else repr(brief(command))
        if idempotent:
            message = (
                f"connection dropped while {what}, on each of {attempts} attempt(s), the last: {cause}; "
                "it only reads the node, but the connection kept dropping: gave up"
            )
        else:
            message = (
                f"connection dropped while {what}: {cause}; its result is unknown (it may have run in part, "
                "in full or not at all) and it was not run again, since it is not marked idempotent: "
                "check the node before running it again"
            )
        super().__init__(host, message)

    def __reduce__(self) -> tuple[Any, ...]:
        # Prefect may pickle a task's exception: rebuilt, it must keep its fields and message.
        kwargs = {"purpose": self.purpose, "attempts": self.attempts, "idempotent": self.idempotent}
        return (_rebuild_interrupted, (self.host, self.command, self.cause, kwargs))

    def restated(self, purpose: str | None, attempts: int = 1, idempotent: bool = False) -> CommandInterrupted:
        """The same drop, told with the caller's purpose (and, for a read, how often it was tried)."""
        return CommandInterrupted(
            self.host, self.command, self.cause, purpose=purpose, attempts=attempts, idempotent=idempotent
        )


def _rebuild_interrupted(host: str, command: str, cause: str, kwargs: dict[str, Any]) -> CommandInterrupted:
    return CommandInterrupted(host, command, cause, **kwargs)


class Transport(Protocol):
    """Runs shell commands on one node. Implementations: SSHTransport, LocalTransport.

    `run` runs a command once, never again by itself: a connection that drops after the command
    was sent raises CommandInterrupted (its result is unknown). Re-running is the caller's call,
    for commands that only read: `run_idempotent`.
    """

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


@dataclass(frozen=True)
class RetryPolicy:
    """How an idempotent command is run again after its connection dropped mid-command.

    `attempts` runs in all, each with the full timeout; a pause before each new attempt, from
    `first_pause_s` growing by `factor` (reconnecting has its own backoff within connect_timeout).
    """

    attempts: int = 3
    first_pause_s: float = 0.5
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_pause_s < 0 or self.factor < 1:
            raise ValueError(f"attempts must be >= 1, first_pause_s >= 0 and factor >= 1, got {self}")

    def pauses(self) -> Iterator[float]:
        """The pause before each attempt after the first (attempts - 1 of them)."""
        pause = self.first_pause_s
        for _ in range(self.attempts - 1):
            yield pause
            pause *= self.factor


RETRY_READS = RetryPolicy()
Logger = logging.Logger | LoggingAdapter


def _logger() -> Logger:
    """The flow run's logger where there is one (retries then show in the run's log), else a plain one."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("k3deploy.transport")


def run_idempotent(
    transport: Transport,
    command: Command,
    timeout: float,
    on_output: OutputCallback | None = None,
    stdin: bytes | None = None,
    *,
    purpose: str,
    policy: RetryPolicy = RETRY_READS,
    logger: Logger | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> CommandResult:
    """Run a command that only reads the node; if the connection drops mid-command, run it again.

    Safe only because running it twice changes nothing: a check, `cat`, `stat`, a listing. Each
    attempt starts on a fresh connection with the full `timeout`; lines of a dropped attempt have
    already gone to `on_output`, and the retry's come after them. Only a drop (CommandInterrupted)
    is retried: a node that cannot be reached was already retried while connecting, and a timeout
    or a non-zero exit is an answer.
    """
    pauses = policy.pauses()
    for attempt in range(1, policy.attempts + 1):
        try:
            return transport.run(command, timeout, on_output, stdin=stdin)
        except CommandInterrupted as err:
            if attempt == policy.attempts:
                raise err.restated(purpose, attempt, idempotent=True) from None
            pause = next(pauses)
            (logger or _logger()).warning(
                "%s: connection dropped while %s (attempt %d of %d: %s); it only reads, so it runs again in %gs",
                transport.host, purpose, attempt, policy.attempts, err.cause, pause,
            )  # fmt: skip
            sleep(pause)
    raise AssertionError("unreachable")


def run_once(
    transport: Transport,
    command: Command,
    timeout: float,
    on_output: OutputCallback | None = None,
    stdin: bytes | None = None,
    *,
    purpose: str,
) -> CommandResult:
    """Run a command that changes the node (starts, downloads, removes): never run again by itself.

    A dropped connection raises CommandInterrupted naming the node and `purpose`: the result is unknown.
    """
    try:
        return transport.run(command, timeout, on_output, stdin=stdin)
    except CommandInterrupted as err:
        raise err.restated(purpose) from None


def run_all(
    transports: Mapping[str, Transport],
    command: Command | Mapping[str, Command],
    timeout: float,
    on_output: OutputCallback | None = None,
    stdin: bytes | Mapping[str, bytes] | None = None,
    *,
    idempotent: bool = False,
    purpose: str | None = None,
) -> dict[str, CommandResult | TransportError]:
    """Run on every node at once; one node's failure never hides another's result.

    `command` (and `stdin`) is the same for all nodes, or a mapping of node name to its own.
    `idempotent=True` says the command only reads: a node whose connection drops mid-command runs
    it again (run_idempotent); otherwise that node's result is a CommandInterrupted. `purpose`
    (e.g. "reading the preflight facts") names the command in messages and logs.
    """
    per_node = command if isinstance(command, Mapping) else dict.fromkeys(transports, command)
    missing = set(per_node) - set(transports)
    if missing:
        raise ValueError(f"no transport for node(s): {', '.join(sorted(missing))}")
    logger = _logger() if idempotent else None  # here: the worker threads do not see the flow run's context

    def one(name: str) -> CommandResult | TransportError:
        try:
            data = stdin.get(name) if isinstance(stdin, Mapping) else stdin
            transport, cmd = transports[name], per_node[name]
            if idempotent:
                what = purpose or "running a read-only command"
                return run_idempotent(transport, cmd, timeout, on_output, data, purpose=what, logger=logger)
            if purpose:
                return run_once(transport, cmd, timeout, on_output, data, purpose=purpose)
            return transport.run(cmd, timeout, on_output, stdin=data)
        except TransportError as err:
            return err

    with ThreadPoolExecutor(max_workers=max(1, len(per_node))) as pool:
        futures = {name: pool.submit(one, name) for name in per_node}
        return {name: future.result() for name, future in futures.items()}


def on_each_node(clients: Mapping[str, C], fn: Callable[[str, C], T]) -> tuple[dict[str, T], dict[str, str]]:
    """Run `fn(node, client)` on all nodes at once: the nodes' results, and the errors of those that failed."""
    with ThreadPoolExecutor(max_workers=max(1, len(clients))) as pool:
        futures = {node: pool.submit(fn, node, client) for node, client in clients.items()}
    results, errors = {}, {}
    for node, future in futures.items():
        try:
            results[node] = future.result()
        except K3DeployError as err:
            errors[node] = str(err)
    return results, errors


def failed_on(what: str, errors: Mapping[str, str]) -> K3DeployError:
    return K3DeployError(f"{what} failed on {len(errors)} node(s):\n  " + "\n  ".join(errors.values()))


def on_every_node(clients: Mapping[str, C], fn: Callable[[str, C], T], what: str) -> dict[str, T]:
    """Run `fn(node, client)` on all nodes at once; every node's failure is reported, none hidden."""
    results, errors = on_each_node(clients, fn)
    if errors:
        raise failed_on(what, errors)
    return results
