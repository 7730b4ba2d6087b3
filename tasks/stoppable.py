"""A long command that can be stopped from outside: bench or an evaluator once the service is lost.

The command runs under `timeout` (which makes itself a process group leader and, on SIGTERM,
passes the signal to its whole group, then SIGKILLs it after the grace); its pid is written to a
pid file first, so a second, short command at the same place (the container, the node, this
machine) can stop it: whatever the transport, nothing of it is left running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import threading
import uuid
from collections.abc import Callable
from typing import Any

from k3deploy.core.errors import CommandTimeout, K3DeployError
from k3deploy.tasks.transport.base import (
    KILL_GRACE_S,
    TIMEOUT_EXIT_CODES,
    CommandResult,
    OutputCallback,
    Transport,
    with_timeout,
)

RETRY_S = 1.0  # a stop is sent again until the command ended (it may not have written its pid yet)
WAKE_S = 0.25  # how often the stopper looks at `stop`
SIGNAL_TIMEOUT_S = 60.0  # a stop or a pid file's removal: a short command


def pid_file() -> str:
    return f"/tmp/k3deploy-stoppable-{uuid.uuid4().hex}.pid"


def stoppable_command(command: str, timeout: float, pidfile: str) -> str:
    """`command` under `timeout`, whose pid (the shell's, which `exec` keeps) goes to `pidfile` first."""
    return f"echo $$ > {shlex.quote(pidfile)}; exec {with_timeout(command, timeout)}"


def stop_command(pidfile: str) -> str:
    """SIGTERM the `timeout` of a stoppable command: it passes it to the command's whole process group."""
    q = shlex.quote(pidfile)
    return f'p=$(cat {q} 2>/dev/null); if [ -n "$p" ]; then kill -TERM "$p" 2>/dev/null; fi; true'


def timed(result: CommandResult, command: str, timeout: float) -> CommandResult:
    """The result under the caller's own command (not its wrapping); `timeout` having killed it (status 124,
    or 137 after the grace) is a CommandTimeout, as a transport says it."""
    result = dataclasses.replace(result, command=command)
    if result.exit_code in TIMEOUT_EXIT_CODES and result.duration_s >= timeout:
        tail = (result.stderr or result.stdout)[-300:]
        raise CommandTimeout(
            result.host, f"killed after {timeout:g}s: {command!r}; last output: {tail!r}", result.stdout, result.stderr
        )
    return result


def run_stoppable(
    start: Callable[[str], CommandResult],
    signal: Callable[[str], Any],
    command: str,
    timeout: float,
    stop: threading.Event | None,
) -> CommandResult:
    """Run `command` with `start`, killed there after `timeout` (CommandTimeout); once `stop` is set,
    stop it by running short commands with `signal`.

    `start` and `signal` run a shell command at the same place (both must reach the same /tmp).
    """
    if stop is None:
        return timed(start(with_timeout(command, timeout)), command, timeout)
    pidfile, done = pid_file(), threading.Event()

    def stopper() -> None:
        while not done.is_set():
            if stop.wait(WAKE_S) and not done.is_set():
                with contextlib.suppress(Exception):  # the node may be gone too: try again until the command ended
                    signal(stop_command(pidfile))
                done.wait(RETRY_S)

    if stop.is_set():
        raise K3DeployError("not started: the service was already lost")
    threading.Thread(target=stopper, daemon=True, name="k3deploy-stopper").start()
    try:
        return timed(start(stoppable_command(command, timeout, pidfile)), command, timeout)
    finally:
        done.set()
        with contextlib.suppress(Exception):  # a pid file left in /tmp must not hide the command's own outcome
            signal(f"rm -f {shlex.quote(pidfile)}")


def run_stoppable_on(
    transport: Transport,
    command: str,
    timeout: float,
    stop: threading.Event | None,
    on_output: OutputCallback | None = None,
) -> CommandResult:
    """run_stoppable through a transport: the command and its stops run on the same node (or here)."""
    return run_stoppable(
        lambda text: transport.run(text, timeout + KILL_GRACE_S + 5, on_output=on_output),  # its own timeout first
        lambda text: transport.run(text, SIGNAL_TIMEOUT_S),
        command,
        timeout,
        stop,
    )
