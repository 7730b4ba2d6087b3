"""The local transport: the same interface as SSH, for the local profile's nodes on this machine."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import threading
import time

from k3deploy.core.errors import CommandTimeout, TransportError
from k3deploy.tasks.transport.base import (
    KILL_GRACE_S,
    Command,
    CommandResult,
    OutputCallback,
    OutputCollector,
    shell_command,
)

READER_GRACE_S = 1.0


class LocalTransport:
    """Runs commands with bash on this machine; `host` names the node it stands in for."""

    def __init__(self, host: str = "localhost") -> None:
        self.host = host

    def run(
        self, command: Command, timeout: float, on_output: OutputCallback | None = None, stdin: bytes | None = None
    ) -> CommandResult:
        text = shell_command(command)
        collector = OutputCollector(self.host, on_output)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                ["bash", "-c", text],
                stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, so a timeout kills the whole tree
            )
        except OSError as exc:
            raise TransportError(self.host, f"cannot start bash: {exc}") from None
        readers = [
            threading.Thread(target=self._pump, args=(pipe, name, collector), daemon=True)
            for pipe, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr"))
        ]
        for reader in readers:
            reader.start()
        if stdin is not None:
            threading.Thread(target=self._feed_stdin, args=(proc, stdin), daemon=True).start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(proc)
            for reader in readers:
                reader.join()
            out, err = collector.finish()
            raise CommandTimeout(
                self.host,
                f"killed after {timeout:g}s: {text!r}; last output: {(err or out)[-300:]!r}",
                out,
                err,
            ) from None
        for reader in readers:
            reader.join(timeout=READER_GRACE_S)  # a background child may hold the pipes open
        out, err = collector.finish()
        return CommandResult(self.host, text, code, out, err, time.monotonic() - started)

    @staticmethod
    def _feed_stdin(proc: subprocess.Popen[bytes], data: bytes) -> None:
        try:
            proc.stdin.write(data)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass  # the command exited without reading its input: its exit status tells the story

    @staticmethod
    def _pump(pipe: io.BufferedIOBase, name: str, collector: OutputCollector) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):
            collector.feed(name, chunk)
        pipe.close()

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)
        with contextlib.suppress(ProcessLookupError):  # members that ignored TERM, even after the leader is gone
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        """Nothing to release."""
