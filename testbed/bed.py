"""Bring the whole bed up or down.

`up` first tears down any stale bed, then builds everything, and if any step
fails it tears down what it made before re-raising. `down` finds what to remove
from names and namespaces (see layout), so it also cleans a bed whose state
file is lost, and it never deletes a folder that the bed did not create.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import hostfs, layout, netns, procs, registry, userssh
from .hostfs import HostPaths
from .npusim.model import NPUS_PER_HOST
from .procs import BedError
from .standin import image as standin_image

MARKER = ".k3deploy-testbed"
ACTIVE = Path("/run/k3deploy-testbed.active")
APT_PACKAGES = (
    "openssh-server openssh-client podman runc conmon netavark iptables "
    "docker-registry busybox-static python3 iproute2 util-linux docker.io (or any docker CLI)"
)
Log = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One up/down at a time (pytest-xdist workers, CI and a person may race)."""
    lock = state_dir.parent / f"{state_dir.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def check_prerequisites() -> None:
    """Fail early, naming the Debian packages, when a tool the bed uses is missing."""
    if os.geteuid() != 0:
        raise BedError("the test bed needs root (network namespaces, mounts, Podman as root)")
    tools = ["ip", "unshare", "nsenter", "mount", "ssh", "ssh-keygen", "podman", "runc", "conmon", "docker-registry"]
    missing = [t for t in tools if shutil.which(t, path=layout.HOST_PATH) is None]
    missing += [p for p in ("/usr/sbin/sshd", "/usr/bin/python3", "/bin/busybox") if not Path(p).exists()]
    if shutil.which("docker", path=layout.HOST_PATH) is None:
        missing.append("docker (CLI, used by `docker system dial-stdio` on each host)")
    if missing:
        raise BedError(f"missing: {', '.join(missing)}; install: apt-get install -y {APT_PACKAGES}")


def _keypair(state_dir: Path) -> Path:
    """The bed key, authorised on every host (their sshd configs all point at one authorized_keys)."""
    key = state_dir / "id_ed25519"
    procs.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "k3deploy-testbed", "-f", str(key)])
    (state_dir / "authorized_keys").write_text((state_dir / "id_ed25519.pub").read_text())
    return key


def _write_ssh_files(state_dir: Path, paths: list[HostPaths]) -> tuple[Path, Path, list[str]]:
    """known_hosts pinning each host key by IP, and an ssh_config usable with `ssh -F`."""
    known = []
    for p in paths:
        keytype, blob = Path(f"{p.host_key}.pub").read_text().split()[:2]
        known.append(f"{layout.host_ip(p.index)} {keytype} {blob}")
    known_hosts = state_dir / "known_hosts"
    known_hosts.write_text("\n".join(known) + "\n")
    config = state_dir / "ssh_config"
    blocks = []
    for p in paths:
        blocks.append(
            f"Host {p.name} {layout.host_ip(p.index)}\n    HostName {layout.host_ip(p.index)}\n"
            f"    User {layout.SSH_USER}\n    Port {layout.SSH_PORT}\n    IdentityFile {state_dir / 'id_ed25519'}\n"
            f"    IdentitiesOnly yes\n    UserKnownHostsFile {known_hosts}\n    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n"
        )
    config.write_text("# k3deploy test bed: ssh -F this-file node0\n" + "\n".join(blocks))
    return known_hosts, config, known


def up(count: int = 4, state_dir: Path | None = None, user_ssh: bool = True, log: Log = _quiet) -> layout.BedState:
    """Create the bed with `count` hosts and write its state file; returns the state."""
    if not 1 <= count <= layout.MAX_HOSTS:
        raise BedError(f"--hosts must be within 1..{layout.MAX_HOSTS}")
    state_file = layout.resolve_state_file(state_dir)
    sdir = state_file.parent
    hostfs.check_state_dir(sdir)
    check_prerequisites()
    with _locked(sdir):
        _down(sdir, log)
        try:
            return _up(count, sdir, state_file, user_ssh, log)
        except BaseException:
            log("up failed; removing what was made")
            _down(sdir, log)
            raise


def _up(count: int, sdir: Path, state_file: Path, user_ssh: bool, log: Log) -> layout.BedState:
    t0 = time.monotonic()
    sdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (sdir / MARKER).write_text("created by python -m testbed up; removed by python -m testbed down\n")
    ACTIVE.write_text(str(sdir) + "\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    key = _keypair(sdir)
    bed = layout.bed_map(count, sdir)
    bed_json = json.dumps(bed.to_json(), indent=1) + "\n"
    (sdir / "npu-sim").mkdir(exist_ok=True)
    (sdir / "npu-sim" / "bed.json").write_text(bed_json)
    (sdir / "empty").touch()  # masks root's dotfiles on every host
    usrlocal = hostfs.install_simulators(sdir, bed)
    devices = hostfs.make_devices(sdir)
    hostfs.prepare_ns_dir(sdir)
    log(f"network: bridge {layout.BRIDGE} {layout.BRIDGE_IP}/{layout.PREFIX_LEN}, {count} namespaces")
    netns.create_bridge()
    netns.create_hosts(count)
    reg = registry.start_registry(sdir)
    paths = [HostPaths(sdir, i) for i in range(count)]
    daemons: dict[str, tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]] = {}

    def start(p: HostPaths) -> None:
        hostfs.prepare_host(p, count, bed, bed_json)
        hostfs.create_namespaces(p, usrlocal, devices)
        daemons[p.name] = (hostfs.start_sshd(p), hostfs.start_podman(p))

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(start, paths))
    log(f"hosts started in {time.monotonic() - t0:.1f}s; publishing the stand-in image")
    registry.wait_registry(reg, sdir)
    t_image = time.monotonic()
    image = standin_image.publish(f"{layout.IMAGE_REPO}:{layout.IMAGE_TAG}", sdir)
    log(f"image {image.ref} ({image.how}) in {time.monotonic() - t_image:.1f}s")
    for p in paths:
        ip, (sshd, podman) = layout.host_ip(p.index), daemons[p.name]
        banner = lambda ip=ip: procs.ssh_banner(ip, layout.SSH_PORT)  # noqa: E731
        procs.wait_until(f"sshd of {p.name}", banner, 30, proc=sshd, log=p.sshd_log)
        ready = lambda s=str(p.podman_sock): procs.podman_ready(s)  # noqa: E731
        procs.wait_until(f"podman of {p.name}", ready, 60, proc=podman, log=p.podman_log)
    known_hosts, ssh_config, known_lines = _write_ssh_files(sdir, paths)
    touched: dict[str, str] = {}
    if user_ssh:
        ips = [layout.host_ip(i) for i in range(count)]
        touched = userssh.install(userssh.config_lines(ips, key, known_hosts, layout.SSH_USER), known_lines)
    state = layout.BedState(
        version=layout.STATE_VERSION,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        state_dir=str(sdir),
        state_file=str(state_file),
        bridge={"name": layout.BRIDGE, "ip": layout.BRIDGE_IP, "prefix": layout.PREFIX_LEN, "route": layout.SUPERNET},
        ssh={
            "user": layout.SSH_USER,
            "port": layout.SSH_PORT,
            "private_key": str(key),
            "public_key": str(key) + ".pub",
            "known_hosts": str(known_hosts),
            "config": str(ssh_config),
            "user_ssh_blocks": touched,
        },
        registry={"address": layout.REGISTRY, "pid": reg.pid, "insecure": True},
        image={
            "ref": image.ref,
            "digest": image.digest,
            "ref_by_digest": image.ref_by_digest,
            "id": image.id,
            "versions": image.versions,
            "rootfs_bytes": image.size,
        },
        npu_sim={"bed_map": str(sdir / "npu-sim" / "bed.json"), "npus_per_host": NPUS_PER_HOST},
        hosts=[_host_state(p, {"sshd": daemons[p.name][0].pid, "podman": daemons[p.name][1].pid}) for p in paths],
    )
    layout.write_state(state)
    log(f"bed up: {count} hosts in {time.monotonic() - t0:.1f}s; state file {state_file}")
    return state


def _host_state(p: HostPaths, pids: dict[str, int]) -> layout.HostState:
    ip = layout.host_ip(p.index)
    return layout.HostState(
        name=p.name,
        index=p.index,
        hostname=p.name,
        ip=ip,
        port=layout.SSH_PORT,
        user=layout.SSH_USER,
        netns=layout.netns_name(p.index),
        dir=str(p.root),
        podman_socket=str(p.podman_sock),
        docker_url=f"ssh://{layout.SSH_USER}@{ip}",
        faults_file=str(p.npu_sim / "faults.json"),
        srv_dir=str(p.srv),
        model_root=layout.MODEL_ROOT,
        npus=[
            {"id": n.id, "ip": n.ip, "vnic_ip": n.vnic_ip, "gateway": n.gateway} for n in layout.npu_addresses(p.index)
        ],
        pids=pids,
    )


def down(state_dir: Path | None = None, log: Log = _quiet) -> list[str]:
    """Remove the bed; returns anything that could not be removed (empty = clean)."""
    if state_dir is None and not os.environ.get(layout.STATE_ENV) and ACTIVE.exists():
        state_dir = Path(ACTIVE.read_text().strip())
    sdir = layout.resolve_state_file(state_dir).parent
    with _locked(sdir):
        problems = _down(sdir, log)
    _drop_stale_leases(sdir)
    return problems


def _drop_stale_leases(sdir: Path) -> None:
    """The pytest plugin's lease folder, once no live session holds or waits on it."""
    leases = layout.leases_dir(sdir)
    if not (leases / ".lock").exists():
        return
    with (leases / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        if not layout.live_leases(leases):
            shutil.rmtree(leases, ignore_errors=True)


def health(state: layout.BedState) -> list[str]:
    """What is wrong with a bed described by a state file (empty = every part answers)."""
    problems = []
    for h in state.hosts:
        if not Path("/run/netns", h.netns).exists():
            problems.append(f"{h.name}: netns {h.netns} missing")
            continue
        with contextlib.suppress(OSError):
            if procs.ssh_banner(h.ip, h.port) and procs.podman_ready(h.podman_socket):
                continue
        problems.append(f"{h.name}: sshd or podman not answering")
    with contextlib.suppress(OSError):
        if procs.http_ok(layout.BRIDGE_IP, layout.REGISTRY_PORT, "/v2/"):
            return problems
    return [*problems, f"registry {layout.REGISTRY} not answering"]


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/") + "/"
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == str(path) or point.startswith(prefix):
            out.append(point)
    return out


def _down(sdir: Path, log: Log) -> list[str]:
    problems: list[str] = []
    touched: dict[str, str] | None = None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        touched = layout.load_state(sdir / layout.STATE_FILE_NAME).ssh.get("user_ssh_blocks") or None
    ns_files = [Path("/run/netns") / n for n in netns.list_bed_netns()]
    ns_files += sorted((sdir / "ns").glob("*.mnt")) + sorted((sdir / "ns").glob("*.uts"))
    inodes = [i for i in (procs.ns_inode(f) for f in ns_files) if i is not None]
    marks = [str(registry.config_path(sdir)), f"unix://{sdir}/hosts/", f"--root {sdir}/build/"]
    pids = procs.bed_pids(inodes, marks)
    if pids:
        log(f"stopping {len(pids)} processes")
        problems += [f"process {p} survived SIGKILL" for p in procs.kill_pids(pids)]
    _remove_cgroups(sdir)
    for f in ns_files:
        if f.parent == sdir / "ns":
            procs.run(["umount", str(f)], check=False)
    while (sdir / "ns").is_dir() and str(sdir / "ns") in _mounts_under(sdir / "ns"):
        if procs.run(["umount", str(sdir / "ns")], check=False).returncode != 0:
            break
    problems += netns.delete_all()
    userssh.remove(touched)
    left = _mounts_under(sdir)
    if left:
        problems.append(f"still mounted, state dir kept: {left}")
    elif (sdir / MARKER).exists():
        shutil.rmtree(sdir, ignore_errors=True)
        if sdir.exists():
            problems.append(f"could not remove {sdir}")
    if ACTIVE.exists() and ACTIVE.read_text().strip() == str(sdir):
        ACTIVE.unlink()
    for problem in problems:
        log(f"down: {problem}")
    return problems


def _remove_cgroups(sdir: Path) -> None:
    """Drop the cgroupfs directories of the bed's containers (empty once they are dead)."""
    ids = {d.name for d in sdir.glob("hosts/*/storage/overlay-containers/*")}
    for parent in Path("/sys/fs/cgroup").glob("*/libpod_parent"):
        for cid in ids:
            for d in parent.glob(f"libpod-{cid}*"):
                for sub in sorted(d.rglob("*"), key=lambda x: -len(x.parts)):
                    if sub.is_dir():
                        with contextlib.suppress(OSError):
                            sub.rmdir()
                with contextlib.suppress(OSError):
                    d.rmdir()
        # podman recreates these on demand; rmdir fails harmlessly while anyone uses them
        for d in (parent / "conmon", parent):
            with contextlib.suppress(OSError):
                d.rmdir()
