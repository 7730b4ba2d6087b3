"""A bed image that runs the REAL CPU vLLM: the stand-in's root filesystem plus what vLLM needs from the host.

The vLLM environment itself (3.5 GB) is not copied into the image (every bed host keeps its own
image storage): it is bind-mounted read-only at the same path, its `bin` first on PATH. What
that environment expects of the system, measured here (DESIGN.md, "turn 2"): the C++ runtime,
libnuma and the older glibc stubs its extensions link against, and `lscpu` (vLLM's CPU platform
runs `lscpu --json`) with its libraries. The stand-in's Debian Python is the one the
environment was built with (`/usr/bin/python3.11`), so the venv's interpreter link resolves.
"""

from __future__ import annotations

import shutil
import tarfile
import tempfile
from pathlib import Path

from ..procs import BedError
from ..registry import import_archive, push_image
from .image import PYTHON, StandinImage, _shared_libraries, _tar_filter, image_changes, resolve_versions, rootfs_archive

# Libraries the CPU build's torch and vLLM extensions load that Python itself does not need.
VLLM_LIBRARIES = (
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libnuma.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libutil.so.1",
)


def host_files() -> dict[str, Path]:
    """Path inside the image → the host file it is copied from (`lscpu` and every library named above)."""
    lscpu = shutil.which("lscpu")
    if lscpu is None:
        raise BedError("lscpu is missing: apt-get install util-linux")
    libc_dir = next(Path(p).parent for p in _shared_libraries([PYTHON]) if Path(p).name.startswith("libc.so"))
    wanted = [str(libc_dir / name) for name in VLLM_LIBRARIES]
    missing = [p for p in wanted if not Path(p).exists()]
    if missing:
        raise BedError(f"host libraries missing for the vLLM runner image: {missing} (apt-get install libnuma1)")
    files = {"usr/bin/lscpu": Path(lscpu).resolve()}
    for lib in [*wanted, *_shared_libraries([Path(lscpu)])]:
        files[lib.lstrip("/")] = Path(lib).resolve()
    return files


def publish_runner(ref: str, state_dir: Path) -> StandinImage:
    """Build the runner image as `ref` from the cached stand-in root filesystem, push it, describe it."""
    versions = resolve_versions()
    base, _cached = rootfs_archive(versions)
    (state_dir / "build").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="runner-", dir=state_dir / "build"))
    try:
        archive = work / "rootfs.tar"
        shutil.copyfile(base, archive)
        with tarfile.open(archive, "a") as tar:
            present = set(tar.getnames())
            for inside, source in sorted(host_files().items()):
                if f"./{inside}" not in present:
                    tar.add(source, arcname=f"./{inside}", filter=_tar_filter)
        changes = [*image_changes(versions), "LABEL org.opencontainers.image.title=k3deploy-bed-vllm-cpu-runner"]
        image_id = import_archive(archive, ref, state_dir, changes)
        digest = push_image(ref, state_dir)
        return StandinImage(
            ref, image_id, digest, versions, archive.stat().st_size, "runner: stand-in + host libraries"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
