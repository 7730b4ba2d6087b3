"""One test host: its private files, its mount/UTS namespaces and its daemons.

Each host is a network namespace plus a persistent mount and UTS namespace
(bind-mounted under <state>/ns/). Inside it:

* hostname nodeN; /etc is an overlay whose upper layer holds the host's own
  hostname, hosts, hccn.conf, ascend_install.info and containers config;
* /usr/local is an overlay adding the NPU tool simulators and /usr/local/Ascend;
* /srv (model root /srv/models), /etc/npu-sim (faults), /tmp are per-host folders;
* /dev is an overlay adding stand-in NPU device nodes (/dev/davinci0..15,
  davinci_manager, devmm_svm, hisi_hdc: all char 1:3 like /dev/null) so the
  A3 `--device` flags work; /dev/pts is a private devpts instance;
* /dev/shm is a private tmpfs (also keeps Podman's SHM locks apart per host);
* root's shell rc files are masked by an empty file, so an SSH exec costs no pyenv init.

sshd and the Podman API service are started with nsenter into all three
namespaces (not `ip netns exec`, which remounts /sys and hides the cgroups from runc).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import layout
from .npusim import formats
from .npusim.model import NPUS_PER_HOST, BedMap
from .procs import CLEAN_ENV, BedError, run, spawn

RC_FILES = (".bashrc", ".profile", ".bash_profile", ".bash_login")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")


def _sub(name: str) -> property:
    """A path under the host's folder, as a read-only attribute."""
    return property(lambda self: self.root / name)


@dataclass(frozen=True)
class HostPaths:
    """Where one host's files live under the state folder."""

    state_dir: Path
    index: int

    @property
    def name(self) -> str:
        return layout.host_name(self.index)

    @property
    def root(self) -> Path:
        return self.state_dir / "hosts" / self.name

    etc_up = _sub("etc.upper")
    etc_wk = _sub("etc.work")
    usr_up = _sub("usrlocal.upper")
    usr_wk = _sub("usrlocal.work")
    srv = _sub("srv")
    npu_sim = _sub("npu-sim")
    tmp = _sub("tmp")
    storage = _sub("storage")
    runroot = _sub("runroot")
    libpod = _sub("libpod")
    imgtmp = _sub("imgtmp")
    host_key = _sub("ssh_host_ed25519_key")
    sshd_config = _sub("sshd_config")
    sshd_log = _sub("sshd.log")
    podman_sock = _sub("podman.sock")
    podman_log = _sub("podman.log")

    @property
    def mnt_ns(self) -> Path:
        return self.state_dir / "ns" / f"{self.name}.mnt"

    @property
    def uts_ns(self) -> Path:
        return self.state_dir / "ns" / f"{self.name}.uts"

    @property
    def net_ns(self) -> Path:
        return Path("/run/netns") / layout.netns_name(self.index)

    def nsenter(self) -> list[str]:
        """argv prefix that runs a command inside this host."""
        return ["nsenter", f"--net={self.net_ns}", f"--mount={self.mnt_ns}", f"--uts={self.uts_ns}", "--"]


def check_state_dir(state_dir: Path) -> None:
    """Mount options and sshd config cannot quote arbitrary paths: insist on plain ones."""
    if not SAFE_PATH.match(str(state_dir)) or len(str(state_dir)) > 60:
        raise BedError(f"state dir {state_dir} must be an absolute path of [A-Za-z0-9._/+-], at most 60 chars")


def prepare_ns_dir(state_dir: Path) -> None:
    """A private bind mount to hold the namespace files (unshare requires it)."""
    ns_dir = state_dir / "ns"
    ns_dir.mkdir(parents=True, exist_ok=True)
    run(["mount", "--bind", str(ns_dir), str(ns_dir)])
    run(["mount", "--make-private", str(ns_dir)])


def install_simulators(state_dir: Path, bed: BedMap) -> Path:
    """The shared lower layer of every host's /usr/local, plus a copy of the simulator code."""
    lib = state_dir / "lib"
    shutil.copytree(Path(__file__).parent / "npusim", lib / "npusim", ignore=shutil.ignore_patterns("__pycache__"))
    run(["/usr/bin/python3", "-m", "compileall", "-q", str(lib)])  # each simulator call is a fresh interpreter
    usr = state_dir / "common" / "usrlocal"
    tools = usr / "Ascend" / "driver" / "tools"
    for d in (usr / "bin", tools, usr / "dcmi"):
        d.mkdir(parents=True, exist_ok=True)
    for tool, path in (("npu-smi", usr / "bin" / "npu-smi"), ("hccn_tool", tools / "hccn_tool")):
        path.write_text(
            "#!/usr/bin/python3 -IS\n"
            f'"""k3deploy test bed: simulated {tool} (source: testbed/npusim)."""\n'
            "import sys\n\n"
            f"sys.path.insert(0, {str(lib)!r})\n"
            "from npusim.cli import main  # noqa: E402\n\n"
            f"sys.exit(main({tool!r}, sys.argv[1:]))\n"
        )
        path.chmod(0o755)
    (usr / "bin" / "hccn_tool").symlink_to("../Ascend/driver/tools/hccn_tool")
    (usr / "Ascend" / "driver" / "version.info").write_text(
        f"Version={bed.driver_version}\npackage_version={bed.driver_version}\nInnerversion=V100R001C19SPC107B220\n"
    )
    return usr


def make_devices(state_dir: Path) -> Path:
    """Stand-ins for the NPU device nodes the A3 `docker run` passes with --device.

    They are character devices 1:3 (what /dev/null is), so a container that opens
    them reads nothing and writes into the void; they only let `--device` work.
    """
    dev = state_dir / "common" / "dev"
    dev.mkdir(parents=True, exist_ok=True)
    names = [f"davinci{i}" for i in range(NPUS_PER_HOST)] + ["davinci_manager", "devmm_svm", "hisi_hdc"]
    for name in names:
        os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        os.chmod(dev / name, 0o666)
    return dev


def _registries_conf() -> str:
    base = Path("/etc/containers/registries.conf")
    text = base.read_text() if base.exists() else ""
    return text + f'\n# k3deploy test bed registry\n[[registry]]\nlocation = "{layout.REGISTRY}"\ninsecure = true\n'


def _containers_conf(p: HostPaths) -> str:
    return f"""# k3deploy test bed: Podman engine of {p.name}
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=32768:32768"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{p.libpod}/events.log"
tmp_dir = "{p.libpod}"
image_copy_tmp_dir = "{p.imgtmp}"

[network]
network_backend = "netavark"
"""


def _hosts_file(index: int, count: int) -> str:
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{layout.host_name(index)}", "::1\tlocalhost ip6-localhost"]
    lines.append(f"{layout.BRIDGE_IP}\tk3tb-controller k3tb-registry")
    lines += [f"{layout.host_ip(i)}\t{layout.host_name(i)}" for i in range(count)]
    return "\n".join(lines) + "\n"


def prepare_host(p: HostPaths, count: int, bed: BedMap, bed_json: str) -> None:
    """Create the host's folders, its /etc upper layer, host key and sshd config."""
    for d in (p.etc_up / "containers", p.etc_up / "npu-sim", p.etc_wk, p.usr_up, p.usr_wk, p.srv / "models"):
        d.mkdir(parents=True, exist_ok=True)
    for d in (p.npu_sim, p.storage, p.runroot, p.libpod, p.imgtmp):
        d.mkdir(parents=True, exist_ok=True)
    p.tmp.mkdir(mode=0o1777, exist_ok=True)
    p.tmp.chmod(0o1777)
    host = bed.host(p.name)
    etc = p.etc_up
    (etc / "hostname").write_text(p.name + "\n")
    (etc / "hosts").write_text(_hosts_file(p.index, count))
    (etc / "hccn.conf").write_text(formats.hccn_conf(host))
    (etc / "ascend_install.info").write_text(
        "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\nDriver_Install_Type=full\n"
        "Driver_Install_Path_Param=/usr/local/Ascend\nDriver_Install_For_All=no\n"
    )
    (etc / "containers" / "containers.conf").write_text(_containers_conf(p))
    (etc / "containers" / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{p.storage}"\nrunroot = "{p.runroot}"\n'
    )
    (etc / "containers" / "registries.conf").write_text(_registries_conf())
    (p.npu_sim / "bed.json").write_text(bed_json)
    (p.npu_sim / "faults.json").write_text("{}\n")
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"k3tb-{p.name}", "-f", str(p.host_key)])
    p.sshd_config.write_text(
        f"""# k3deploy test bed: sshd of {p.name} (netns {layout.netns_name(p.index)})
ListenAddress {layout.host_ip(p.index)}:{layout.SSH_PORT}
HostKey {p.host_key}
PidFile {p.root}/sshd.pid
AuthorizedKeysFile {p.state_dir}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitEmptyPasswords no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 200
MaxSessions 100
AcceptEnv LANG LC_*
SetEnv DOCKER_HOST=unix://{p.podman_sock}
Subsystem sftp internal-sftp
"""
    )


def create_namespaces(p: HostPaths, usrlocal: Path, devices: Path) -> None:
    """Make the host's persistent mount + UTS namespaces and its private mounts."""
    empty = p.state_dir / "empty"  # created once by `up`
    for ns_file in (p.mnt_ns, p.uts_ns):
        ns_file.touch()
    q = shlex.quote
    steps = [
        "set -e",
        f"hostname {q(p.name)}",
        f"mount -t overlay k3tb-etc -o lowerdir=/etc,upperdir={p.etc_up},workdir={p.etc_wk} /etc",
        f"mount -t overlay k3tb-usrlocal -o lowerdir={usrlocal}:/usr/local,upperdir={p.usr_up},workdir={p.usr_wk}"
        " /usr/local",
        f"mount --bind {q(str(p.srv))} /srv",
        f"mount --bind {q(str(p.npu_sim))} /etc/npu-sim",
        f"mount --bind {q(str(p.tmp))} /tmp",
        f"mount -t overlay k3tb-dev -o lowerdir={devices}:/dev /dev",
        "mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 k3tb-devpts /dev/pts",
        "mount --bind /dev/pts/ptmx /dev/ptmx",
        "mount -t tmpfs -o mode=1777,nosuid,nodev k3tb-shm /dev/shm",
        "mount -t mqueue k3tb-mqueue /dev/mqueue 2>/dev/null || true",
    ]
    steps += [f"if [ -e /root/{f} ]; then mount --bind {q(str(empty))} /root/{f}; fi" for f in RC_FILES]
    run(
        [
            "unshare",
            f"--mount={p.mnt_ns}",
            f"--uts={p.uts_ns}",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            "\n".join(steps),
        ]
    )


def start_sshd(p: HostPaths) -> subprocess.Popen[bytes]:
    sshd = shutil.which("sshd", path="/usr/sbin:/usr/bin") or "/usr/sbin/sshd"
    return spawn([*p.nsenter(), sshd, "-D", "-f", str(p.sshd_config), "-E", str(p.sshd_log)], p.root / "sshd.out")


def start_podman(p: HostPaths) -> subprocess.Popen[bytes]:
    argv = [*p.nsenter(), "podman", "system", "service", "--time=0", f"unix://{p.podman_sock}"]
    return spawn(argv, p.podman_log, env=CLEAN_ENV)
