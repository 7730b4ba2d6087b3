"""The bed's image registry and the images pushed to it, all built offline.

A real Distribution registry (Debian `docker-registry`) listens on the bridge
address; every host's registries.conf marks it insecure (plain HTTP). Images
are made from a root filesystem folder with `podman import` (or `podman build`
when the folder holds a Containerfile), using a builder Podman whose storage is
inside the state folder, then pushed so hosts pull by tag or by digest.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from . import layout
from .procs import CLEAN_ENV, BedError, http_ok, run, spawn, wait_until

DEFAULT_CHANGES = ('CMD ["/bin/sh"]', "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def config_path(state_dir: Path) -> Path:
    return state_dir / "registry" / "config.yml"


def start_registry(state_dir: Path) -> subprocess.Popen[bytes]:
    """Start the registry on the bridge address (the bridge must exist)."""
    root = state_dir / "registry"
    (root / "data").mkdir(parents=True, exist_ok=True)
    config_path(state_dir).write_text(
        f"""# k3deploy test bed registry
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {root / "data"}
  delete:
    enabled: true
http:
  addr: {layout.REGISTRY}
  secret: k3deploy-testbed-not-secret
"""
    )
    binary = shutil.which("docker-registry", path="/usr/bin:/usr/local/bin")
    if binary is None:
        raise BedError("docker-registry not found: apt-get install docker-registry")
    return spawn([binary, "serve", str(config_path(state_dir))], root / "registry.log", env=CLEAN_ENV)


def wait_registry(proc: subprocess.Popen[bytes], state_dir: Path, timeout: float = 30) -> None:
    wait_until(
        f"registry {layout.REGISTRY}",
        lambda: http_ok(layout.BRIDGE_IP, layout.REGISTRY_PORT, "/v2/"),
        timeout,
        proc=proc,
        log=state_dir / "registry" / "registry.log",
    )


def builder(state_dir: Path) -> list[str]:
    """argv prefix of the controller-side Podman used only to build and push images."""
    b = state_dir / "build"
    return [
        "podman",
        "--root",
        str(b / "storage"),
        "--runroot",
        str(b / "run"),
        "--tmpdir",
        str(b / "tmp"),
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
        "--runtime",
        "runc",
        "--network-backend",
        "netavark",
    ]


def _is_static_elf(path: Path) -> bool:
    """True when an ELF binary has no PT_INTERP segment (needs no dynamic loader)."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit only
        return False
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 0x20)[0], *struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + k * phentsize)[0] != 3 for k in range(phnum))


def busybox_rootfs(dest: Path) -> Path:
    """A minimal root filesystem: static busybox and its applets, /etc/passwd, /tmp."""
    busybox = Path("/bin/busybox")
    if not busybox.exists() or not _is_static_elf(busybox.resolve()):
        raise BedError("/bin/busybox is missing or not static: apt-get install busybox-static")
    for d in ("bin", "etc", "root", "tmp", "proc", "sys", "dev", "srv"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    shutil.copy2(busybox, dest / "bin" / "busybox")
    applets = run([str(busybox), "--list"]).stdout.split()
    for applet in applets:
        link = dest / "bin" / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("busybox")
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    (dest / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    return dest


def build_image(context: Path, ref: str, state_dir: Path, changes: Sequence[str] = DEFAULT_CHANGES) -> str:
    """Build image `ref` from a folder and return its image id.

    A folder holding a Containerfile/Dockerfile is built with `podman build`
    (offline: only `FROM scratch` or images already in the builder work);
    any other folder is taken as the image's root filesystem and imported,
    with `changes` as Dockerfile-style instructions (CMD, ENV, ENTRYPOINT, ...).
    """
    _builder_dirs(state_dir)
    for name in ("Containerfile", "Dockerfile"):
        if (context / name).exists():
            run([*builder(state_dir), "build", "--pull=never", "-f", str(context / name), "-t", ref, str(context)])
            return _image_id(ref, state_dir)
    fd, name = tempfile.mkstemp(prefix="rootfs-", suffix=".tar", dir=state_dir / "build")
    archive = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w") as tar:
            tar.add(context, arcname=".")
        return import_archive(archive, ref, state_dir, changes)
    finally:
        archive.unlink(missing_ok=True)


def import_archive(archive: Path, ref: str, state_dir: Path, changes: Sequence[str] = DEFAULT_CHANGES) -> str:
    """`podman import` a root filesystem tar as image `ref` (with Dockerfile-style `changes`); returns its id."""
    _builder_dirs(state_dir)
    argv = [*builder(state_dir), "import"]
    for change in changes:
        argv += ["--change", change]
    run([*argv, str(archive), ref], timeout=300)
    return _image_id(ref, state_dir)


def _builder_dirs(state_dir: Path) -> None:
    for d in ("storage", "run", "tmp"):
        (state_dir / "build" / d).mkdir(parents=True, exist_ok=True)


def _image_id(ref: str, state_dir: Path) -> str:
    image_id = run([*builder(state_dir), "image", "inspect", "--format", "{{.Id}}", ref]).stdout.strip()
    return image_id if image_id.startswith("sha256:") else f"sha256:{image_id}"  # as the Docker API reports it


def push_image(ref: str, state_dir: Path) -> str:
    """Push `ref` to the bed registry (plain HTTP) and return the manifest digest."""
    _builder_dirs(state_dir)
    fd, name = tempfile.mkstemp(prefix="digest-", dir=state_dir / "build")
    os.close(fd)
    digest_file = Path(name)
    try:
        run([*builder(state_dir), "push", "--tls-verify=false", "--digestfile", str(digest_file), ref], timeout=300)
        digest = digest_file.read_text().strip()
    finally:
        digest_file.unlink(missing_ok=True)
    if not digest.startswith("sha256:"):
        raise BedError(f"push of {ref} gave no digest: {digest!r}")
    return digest


MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
)


def has_content(repo: str, kind: str, digest: str, timeout: float = 5) -> bool:
    """True when the bed registry answers HEAD /v2/<repo>/<kind>/<digest> (kind: manifests or blobs) with 200."""
    url = f"http://{layout.REGISTRY}/v2/{repo}/{kind}/{digest}"
    req = urllib.request.Request(url, method="HEAD", headers={"Accept": ", ".join(MANIFEST_TYPES)})
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy
    try:
        with direct.open(req, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False
