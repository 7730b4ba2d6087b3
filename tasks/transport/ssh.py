"""The SSH transport: pinned host keys, one reused connection per node, remote-side timeouts."""

from __future__ import annotations

import base64
import hashlib
import select
import socket
import threading
import time
from pathlib import Path

import paramiko
from pydantic import SecretStr

from k3deploy.blocks.ssh_keys import host_key_entry, load_private_key
from k3deploy.core.errors import CommandTimeout, ConnectionFault, HostKeyError, TransportError
from k3deploy.tasks.transport.base import (
    KILL_GRACE_S,
    TIMEOUT_EXIT_CODES,
    Command,
    CommandInterrupted,
    CommandResult,
    OutputCallback,
    OutputCollector,
    shell_command,
    with_timeout,
)

_CONNECT_FAULTS = (OSError, socket.timeout, EOFError, paramiko.SSHException)


def openssh_fingerprint(key_blob: bytes) -> str:
    """A host key's fingerprint as OpenSSH prints it: SHA256 of the key blob, base64 without padding."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key_blob).digest()).decode().rstrip("=")


class _TrustAndRecord(paramiko.MissingHostKeyPolicy):
    """Explicit opt-in only: accept an unknown host and write its key to known_hosts."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class SSHTransport:
    """Commands on one node over SSH; safe to share between threads."""

    def __init__(
        self,
        host: str,
        *,
        user: str = "root",
        port: int = 22,
        known_hosts: str | Path = "~/.ssh/known_hosts",
        private_key: SecretStr | None = None,
        private_key_file: str | Path | None = None,
        connect_timeout: float = 10.0,
        trust_new_hosts: bool = False,
        name: str | None = None,
    ) -> None:
        self.host = name or host
        self.address, self.user, self.port = host, user, port
        self.known_hosts = Path(known_hosts).expanduser()
        self._pkey = load_private_key(private_key) if private_key is not None else None
        self._key_file = str(Path(private_key_file).expanduser()) if private_key_file else None
        self.connect_timeout = connect_timeout
        self.trust_new_hosts = trust_new_hosts
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    # -- connection ---------------------------------------------------------------------------

    def _new_client(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        elif not self.trust_new_hosts:
            raise HostKeyError(self.host, f"known_hosts file {self.known_hosts} does not exist; no key is pinned")
        if self.trust_new_hosts:
            client.set_missing_host_key_policy(_TrustAndRecord(self.known_hosts))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        return client

    def _connect_once(self, timeout: float) -> paramiko.SSHClient:
        client = self._new_client()
        try:
            client.connect(
                self.address,
                port=self.port,
                username=self.user,
                pkey=self._pkey,
                key_filename=self._key_file,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                allow_agent=False,
                look_for_keys=self._pkey is None and self._key_file is None,
            )
        except paramiko.BadHostKeyException as err:
            client.close()
            raise HostKeyError(
                self.host,
                f"host key CHANGED for {host_key_entry(self.address, self.port)}: known_hosts "
                f"{self.known_hosts} pins {openssh_fingerprint(err.expected_key.asbytes())} but the node offers "
                f"{openssh_fingerprint(err.key.asbytes())}; refusing (possible man-in-the-middle or reinstalled node)",
            ) from None
        except paramiko.AuthenticationException:
            client.close()
            raise TransportError(self.host, f"SSH authentication failed for user {self.user}") from None
        except paramiko.SSHException as err:
            client.close()
            if "not found in known_hosts" in str(err):
                raise HostKeyError(
                    self.host,
                    f"unknown host key for {host_key_entry(self.address, self.port)}: not in "
                    f"{self.known_hosts}; verify its fingerprint and add it, or trust new hosts explicitly",
                ) from None
            raise
        except BaseException:
            client.close()
            raise
        return client

    def connect(self) -> paramiko.SSHClient:
        """The live connection, reconnecting with backoff within connect_timeout on connection faults."""
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is not None and transport.is_active():
                return self._client  # type: ignore[return-value]
            deadline = time.monotonic() + self.connect_timeout
            delay, last = 0.2, "no attempt"
            while (left := deadline - time.monotonic()) > 0:
                try:
                    self._client = self._connect_once(left)
                    return self._client
                except (HostKeyError, TransportError):
                    raise
                except _CONNECT_FAULTS as err:
                    last = f"{type(err).__name__}: {err}"
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay *= 2
            raise ConnectionFault(
                self.host, f"cannot reach {self.address}:{self.port} within {self.connect_timeout:g}s ({last})"
            )

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _forget(self, connection: paramiko.Transport | None) -> None:
        """Close a connection a command lost (the next run reconnects), unless another thread has replaced it."""
        with self._lock:
            if self._client is not None and self._client.get_transport() in (connection, None):
                self._client.close()
                self._client = None

    # -- commands -----------------------------------------------------------------------------

    def _open_session(self) -> paramiko.Channel:
        # A reused connection may have died since; the command has not started, so one retry is safe.
        for attempt in (1, 2):
            client = self.connect()
            try:
                return client.get_transport().open_session(timeout=self.connect_timeout)  # type: ignore[union-attr]
            except _CONNECT_FAULTS as err:
                self.close()
                if attempt == 2:
                    raise ConnectionFault(self.host, f"cannot open an SSH session: {err}") from None
        raise AssertionError("unreachable")

    @staticmethod
    def _dropped(channel: paramiko.Channel) -> bool:
        """True when a channel ended without an exit status because the connection went, not the command.

        paramiko closes every channel of a dead connection and reports -1 for the status it never
        got, as for a command killed by a signal (sshd sends exit-signal, which paramiko ignores). The
        signal's case has seen the command's end of output on a live connection; a drop has not.
        """
        connection = channel.get_transport()
        return not channel.eof_received or connection is None or not connection.is_active()

    def run(
        self, command: Command, timeout: float, on_output: OutputCallback | None = None, stdin: bytes | None = None
    ) -> CommandResult:
        """Run `command` once on the node; a connection that drops after it was sent raises CommandInterrupted."""
        text = shell_command(command)
        channel = self._open_session()
        collector = OutputCollector(self.host, on_output)
        started = time.monotonic()
        local_deadline = started + timeout + KILL_GRACE_S + 5  # the node's own timeout fires first
        try:
            channel.exec_command(with_timeout(text, timeout))
            if stdin:
                channel.sendall(stdin)  # small inputs (a job description): fits the channel window
            channel.shutdown_write()  # EOF: a command reading stdin never waits on us
            # Done when the exit status is in and the output has ended (EOF): sshd may send the status
            # before the last stderr bytes, so the status alone would lose them.
            while not (
                channel.exit_status_ready()
                and (channel.eof_received or channel.closed)
                and not channel.recv_ready()
                and not channel.recv_stderr_ready()
            ):
                if time.monotonic() > local_deadline:
                    raise CommandTimeout(self.host, f"no exit after {timeout:g}s and the kill grace: {text!r}")
                select.select([channel], [], [], 0.2)
                while channel.recv_ready():
                    collector.feed("stdout", channel.recv(65536))
                while channel.recv_stderr_ready():
                    collector.feed("stderr", channel.recv_stderr(65536))
            code = channel.recv_exit_status()
            if code == -1 and self._dropped(channel):
                raise EOFError("the connection closed before the command's exit status came")
        except (OSError, EOFError, paramiko.SSHException) as exc:
            self._forget(channel.get_transport())
            cause = f"{str(exc) or type(exc).__name__}, after {time.monotonic() - started:.1f}s"
            raise CommandInterrupted(self.host, text, cause) from None
        finally:
            channel.close()
        duration = time.monotonic() - started
        out, err = collector.finish()
        if code in TIMEOUT_EXIT_CODES and duration >= timeout:
            raise CommandTimeout(
                self.host,
                f"killed on the node after {timeout:g}s: {text!r}; last output: {(err or out)[-300:]!r}",
                out,
                err,
            )
        return CommandResult(self.host, text, code, out, err, duration)
