"""pytest fixtures for tests that need the test bed (mark them `@pytest.mark.testbed`).

Load with `-p testbed.pytest_plugin` or `pytest_plugins = ["testbed.pytest_plugin"]`.

* `testbed` (session): a `Testbed` for the running bed. If the state file
  ($K3DEPLOY_TESTBED_STATE or /run/k3deploy-testbed/testbed.json) exists, that
  bed is used and left running; otherwise the fixture starts one
  ($K3DEPLOY_TESTBED_HOSTS hosts, default 4) and the last session using it
  (pytest-xdist workers hold leases) stops it. Skips when not root.
* `testbed_faults` (function): a `FaultInjector` writing /etc/npu-sim/faults.json
  on hosts; every host it touched is healthy again after the test.
* `testbed_docker` (function): `testbed_docker(host)` -> docker.DockerClient over
  ssh:// to that host's Podman engine, closed after the test.
* `testbed_left_as_found` (module, automatic where a module's tests use the bed): what
  every host runs and is told is read before the module's first test and after its
  last; a module that leaves a container or an NPU fault behind fails, naming them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import layout
from .layout import BedState, HostState, load_state, resolve_state_file
from .procs import http_over_unix

HOSTS_ENV = "K3DEPLOY_TESTBED_HOSTS"


@dataclass(frozen=True)
class Testbed:
    """A running bed as tests see it."""

    __test__ = False  # not a test class, despite the name

    state: BedState
    hosts: tuple[HostState, ...]
    key: Path
    known_hosts: Path
    ssh_config: Path
    registry: str
    image_ref: str
    image_digest: str
    image_ref_by_digest: str

    @classmethod
    def from_state(cls, state: BedState) -> Testbed:
        return cls(
            state=state,
            hosts=tuple(state.hosts),
            key=Path(state.ssh["private_key"]),
            known_hosts=Path(state.ssh["known_hosts"]),
            ssh_config=Path(state.ssh["config"]),
            registry=state.registry["address"],
            image_ref=state.image["ref"],
            image_digest=state.image["digest"],
            image_ref_by_digest=state.image["ref_by_digest"],
        )

    def host(self, name: str) -> HostState:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def ssh_argv(self, host: HostState, command: str, known_hosts: Path | None = None) -> list[str]:
        """`ssh` argv with the bed key and pinned host keys only (no ~/.ssh involved)."""
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts or self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            "-p",
            str(host.port),
            f"{host.user}@{host.ip}",
            command,
        ]

    def ssh(
        self, host: HostState, command: str, *, input: str | None = None, timeout: float = 30, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command on a host; with check, fail showing its stderr."""
        proc = subprocess.run(
            self.ssh_argv(host, command), input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{host.name}: {command!r} -> rc {proc.returncode}\n{proc.stderr}")
        return proc


class FaultInjector:
    """Writes a host's NPU faults file (schema: testbed.npusim docstring)."""

    def __init__(self, bed: Testbed) -> None:
        self._bed = bed
        self.touched: set[str] = set()

    def _host(self, host: HostState | str) -> HostState:
        return self._bed.host(host) if isinstance(host, str) else host

    def set(self, host: HostState | str, faults: Mapping[str, Any], *, via_ssh: bool = False) -> None:
        """Replace the host's faults; via_ssh writes /etc/npu-sim/faults.json through SSH."""
        h = self._host(host)
        self.touched.add(h.name)
        text = json.dumps(dict(faults), indent=1) + "\n"
        if via_ssh:
            new = "/etc/npu-sim/faults.json.new"
            self._bed.ssh(h, f"cat > {new} && mv {new} /etc/npu-sim/faults.json", input=text)
            return
        path = Path(h.faults_file)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)

    def get(self, host: HostState | str) -> dict[str, Any]:
        return json.loads(Path(self._host(host).faults_file).read_text() or "{}")

    def clear(self, host: HostState | str | None = None) -> None:
        """Heal one host, or every host this injector touched."""
        for name in [self._host(host).name] if host is not None else sorted(self.touched):
            self.set(name, {})


@contextlib.contextmanager
def _fixture_lock(state_file: Path) -> Iterator[Path]:
    leases = layout.leases_dir(state_file.parent)
    leases.mkdir(parents=True, exist_ok=True)
    with (leases / ".lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield leases


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "testbed: needs the test bed (netns hosts, sshd, podman, registry)")


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """The running test bed, started here (and stopped by the last user) if absent."""
    if os.geteuid() != 0:
        pytest.skip("the test bed needs root")
    from . import bed  # imported lazily: only bed tests pay for it

    state_file = resolve_state_file()
    with _fixture_lock(state_file) as leases:
        stale = state_file.exists() and bed.health(load_state(state_file))
        if not state_file.exists() or stale:  # a state file can outlive its bed (crash, reboot: /run is on disk)
            bed.up(int(os.environ.get(HOSTS_ENV, "4")))
            (leases / ".owned").write_text("started by the pytest fixture\n")
        (leases / str(os.getpid())).touch()
        state = load_state(state_file)
    try:
        yield Testbed.from_state(state)
    finally:
        with _fixture_lock(state_file) as leases:
            (leases / str(os.getpid())).unlink(missing_ok=True)
            if (leases / ".owned").exists() and not layout.live_leases(leases):
                bed.down(Path(state.state_dir))
                (leases / ".owned").unlink()
                shutil.rmtree(leases, ignore_errors=True)  # nobody else is using this bed


@pytest.fixture
def testbed_faults(testbed: Testbed) -> Iterator[FaultInjector]:
    """Inject NPU faults on hosts; all touched hosts are healed after the test."""
    injector = FaultInjector(testbed)
    try:
        yield injector
    finally:
        injector.clear()


@pytest.fixture
def testbed_docker(testbed: Testbed) -> Iterator[Callable[[HostState | str], Any]]:
    """Factory of docker.DockerClient (ssh:// to a host's Podman), closed after the test."""
    import docker

    clients: list[Any] = []

    def connect(host: HostState | str) -> Any:
        h = testbed.host(host) if isinstance(host, str) else host
        client = docker.DockerClient(base_url=h.docker_url, timeout=120)
        clients.append(client)
        return client

    try:
        yield connect
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()


def bed_snapshot(testbed: Testbed) -> dict[str, dict[str, Any]]:
    """What a test could leave behind on each host: its containers (any state) and its NPU faults."""
    out: dict[str, dict[str, Any]] = {}
    for h in testbed.hosts:
        status, body = http_over_unix(h.podman_socket, "/v1.41/containers/json?all=1", timeout=30)
        if status != 200:
            raise RuntimeError(f"{h.name}: the Podman API answered {status} listing containers")
        names = sorted(n.lstrip("/") for c in json.loads(body) for n in c.get("Names") or [])
        faults_file = Path(h.faults_file)
        faults = json.loads(faults_file.read_text() or "{}") if faults_file.exists() else {}
        out[h.name] = {"containers": names, "faults": faults}
    return out


def snapshot_changes(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Each host's difference, in words: containers left or gone, faults changed."""
    changes = []
    for host in sorted(before.keys() | after.keys()):
        was, now = before.get(host, {}), after.get(host, {})
        left = sorted(set(now.get("containers", [])) - set(was.get("containers", [])))
        gone = sorted(set(was.get("containers", [])) - set(now.get("containers", [])))
        if left:
            changes.append(f"{host}: containers left behind: {', '.join(left)}")
        if gone:
            changes.append(f"{host}: containers that were there are gone: {', '.join(gone)}")
        if was.get("faults", {}) != now.get("faults", {}):
            changes.append(f"{host}: NPU faults {was.get('faults', {})} became {now.get('faults', {})}")
    return changes


@pytest.fixture(scope="module", autouse=True)
def testbed_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every module of bed tests leaves the bed as it found it: read before and after, any change fails."""
    uses_bed = any("testbed" in getattr(item, "fixturenames", ()) for item in request.session.items
                   if getattr(item, "module", None) is request.module)  # fmt: skip
    if not uses_bed:
        yield
        return
    bed: Testbed = request.getfixturevalue("testbed")
    before = bed_snapshot(bed)
    yield
    changes = snapshot_changes(before, bed_snapshot(bed))
    if changes:
        pytest.fail(f"{request.module.__name__} left the test bed changed: " + "; ".join(changes), pytrace=False)
