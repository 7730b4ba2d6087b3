"""The test bed's stand-in vLLM-Ascend image, built offline from this machine's own files.

Root filesystem (`build_rootfs`):

* `/bin`: static busybox and its applets (the shell), `/bin/bash` a wrapper around busybox `sh`
  (the seed's `docker run ... "$IMAGE" bash` works);
* `/usr/bin/python3.11` (+ `python3`, `python`): Debian's interpreter with the shared libraries
  `ldd` names for it and its extension modules, and the standard library from
  `/usr/lib/python3.11` without test suites, idlelib, tkinter, turtledemo, ensurepip, lib2to3,
  pydoc_data, the static libpython (`config-3.11-*`) and `__pycache__`;
* `/usr/local/lib/python3.11/dist-packages`: `vllm` (its `entrypoints/cli/main.py` is
  `vllm_standin.py`), `vllm_ascend` and `pip` (`pip_shim.py`) with `*.dist-info` (METADATA,
  RECORD, entry points) so that `pip show vllm vllm-ascend` answers as in the real image;
* `/usr/local/bin/vllm`, `pip`, `pip3`: console scripts as pip writes them.

The archive of that folder is cached outside the state folder (`$K3DEPLOY_TESTBED_CACHE`,
default /var/cache/k3deploy-testbed), keyed by a hash of everything it is made from, so
`testbed up` only imports and pushes it. `build_and_push(ref, state_dir, versions)` makes
an image with other versions (e.g. for a version-mismatch test).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import registry
from ..procs import BedError, run
from .pip_shim import PIP_VERSION

DEFAULT_VERSIONS = {"vllm": "0.27.1", "vllm_ascend": "0.27.1rc1"}
PY = "3.11"
PYTHON = Path(f"/usr/bin/python{PY}")
STDLIB = Path(f"/usr/lib/python{PY}")
BUSYBOX = Path("/bin/busybox")
SITE = Path(f"usr/local/lib/python{PY}/dist-packages")
CACHE_ENV = "K3DEPLOY_TESTBED_CACHE"
DEFAULT_CACHE = Path("/var/cache/k3deploy-testbed")
KEEP_ARCHIVES = 4
HERE = Path(__file__).resolve().parent

# Left out of the copied standard library (names at its top level / anywhere below it).
SKIP_TOP = {
    "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "site-packages",
    "dist-packages", f"config-{PY}-x86_64-linux-gnu", "turtle.py", "EXTERNALLY-MANAGED",
}  # fmt: skip
SKIP_ANY = {"__pycache__", "test", "tests", "idle_test"}
# Extension modules left out: test helpers, and those pulling in large libraries nobody here uses.
SKIP_DYNLOAD = {"_tkinter", "nis", "_dbm", "_gdbm", "_testcapi", "_testinternalcapi", "_testbuffer",
                "_testimportmultiple", "_testmultiphase", "_testclinic", "_ctypes_test", "_xxtestfuzz",
                "xxlimited", "xxlimited_35", "_xxsubinterpreters", "xxsubtype"}  # fmt: skip
PIP_MAIN = "import sys\n\nfrom pip import main\n\nif __name__ == '__main__':\n    sys.exit(main())\n"
PLUGIN_HOOKS = """

def register():
    \"\"\"Platform plugin entry point: the class vLLM would load.\"\"\"
    return "vllm_ascend.platform.NPUPlatform"


def register_model():
    \"\"\"General plugin entry point (no models to register in the stand-in).\"\"\"


def register_connector():
    \"\"\"General plugin entry point (no KV connectors in the stand-in).\"\"\"
"""
SETUP_SCRIPTS = {
    "/usr/local/Ascend/ascend-toolkit/set_env.sh": "export ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest",
    "/usr/local/Ascend/nnal/atb/set_env.sh": "export ATB_HOME_PATH=/usr/local/Ascend/nnal/atb/latest/atb/cxx_abi_1",
}
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+!_-]*$")


@dataclass(frozen=True)
class StandinImage:
    """An image built and pushed to the bed registry."""

    ref: str
    id: str
    digest: str
    versions: dict[str, str] = field(default_factory=dict)
    size: int = 0  # bytes of the uncompressed root filesystem archive
    how: str = ""  # built / imported from the cached root filesystem / restored from the registry cache

    @property
    def ref_by_digest(self) -> str:
        return f"{self.ref.rsplit(':', 1)[0]}@{self.digest}"


def resolve_versions(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """DEFAULT_VERSIONS updated by `overrides` ({"vllm": ..., "vllm_ascend": ...})."""
    versions = dict(DEFAULT_VERSIONS)
    for key, value in (overrides or {}).items():
        key = key.replace("-", "_")
        if key not in versions:
            raise BedError(f"unknown package {key!r}: only {sorted(versions)} can be given a version")
        versions[key] = value
    for key, value in versions.items():
        if not _VERSION.match(value):
            raise BedError(f"bad version for {key}: {value!r}")
    return versions


# --------------------------------------------------------------------------- site-packages


def _metadata(name: str, version: str, summary: str, home: str, author: str, requires: list[str], extra: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {summary}",
        f"Home-page: {home}",
        f"Author: {author}",
        "License: Apache 2.0",
        f"Project-URL: Homepage, {home}",
        "Classifier: Programming Language :: Python :: 3.11",
        "Classifier: License :: OSI Approved :: Apache Software License",
        "Requires-Python: >=3.10",
        "Description-Content-Type: text/markdown",
        *[f"Requires-Dist: {r}" for r in requires],
        "",
        extra,
    ]
    return "\n".join(lines) + "\n"


def _packages(versions: Mapping[str, str]) -> dict[str, dict[str, str | bytes]]:
    """Distribution -> {path relative to site-packages: text} (dist-info RECORD added later)."""
    vllm, ascend = versions["vllm"], versions["vllm_ascend"]
    note = "k3deploy test-bed stand-in (testbed/standin): metadata only, no model code."
    init = '"""{0} (k3deploy test-bed stand-in)."""\n\n__version__ = "{1}"\n'
    standin = (HERE / "vllm_standin.py").read_text()
    shim = (HERE / "pip_shim.py").read_text()
    return {
        f"vllm-{vllm}": {
            "vllm/__init__.py": init.format("vLLM", vllm),
            "vllm/entrypoints/__init__.py": "",
            "vllm/entrypoints/cli/__init__.py": "",
            "vllm/entrypoints/cli/main.py": standin,
            f"vllm-{vllm}.dist-info/METADATA": _metadata(
                "vllm",
                vllm,
                "A high-throughput and memory-efficient inference and serving engine for LLMs",
                "https://github.com/vllm-project/vllm",
                "vLLM Team",
                [
                    "regex",
                    "cachetools",
                    "psutil",
                    "sentencepiece",
                    "numpy",
                    "requests>=2.26.0",
                    "tqdm",
                    "blake3",
                    "py-cpuinfo",
                    "transformers>=4.56.0",
                    "tokenizers>=0.21.1",
                    "protobuf",
                    "fastapi[standard]>=0.115.0",
                    "aiohttp",
                    "openai>=1.99.1",
                    "pydantic>=2.11.7",
                    "prometheus_client>=0.18.0",
                    "pillow",
                    "prometheus-fastapi-instrumentator>=7.0.0",
                    "tiktoken>=0.6.0",
                    "lm-format-enforcer==0.11.3",
                    "outlines_core==0.2.11",
                    "xgrammar==0.1.25",
                    "typing_extensions>=4.10",
                    "filelock>=3.16.1",
                    "partial-json-parser",
                    "pyzmq>=25.0.0",
                    "msgspec",
                    "gguf>=0.13.0",
                    "mistral_common[image]>=1.8.2",
                    "pyyaml",
                    "einops",
                    "compressed-tensors==0.12.2",
                    "depyf==0.19.0",
                    "cloudpickle",
                    "watchfiles",
                    "python-json-logger",
                    "scipy",
                    "ninja",
                    "pybase64",
                    "cbor2",
                    "setproctitle",
                    "openai-harmony>=0.0.3",
                    "anthropic==0.71.0",
                    'tensorizer==2.10.1; extra == "tensorizer"',
                ],
                note,
            ),
            f"vllm-{vllm}.dist-info/entry_points.txt": "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n",
            f"vllm-{vllm}.dist-info/top_level.txt": "vllm\n",
            f"vllm-{vllm}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: setuptools (80.9.0)\nRoot-Is-Purelib: "
            "false\nTag: cp311-cp311-linux_x86_64\n\n",
            f"vllm-{vllm}.dist-info/INSTALLER": "pip\n",
            "../../../bin/vllm": _script("vllm.entrypoints.cli.main"),
        },
        f"vllm_ascend-{ascend}": {
            "vllm_ascend/__init__.py": init.format("vLLM Ascend plugin", ascend) + PLUGIN_HOOKS,
            f"vllm_ascend-{ascend}.dist-info/METADATA": _metadata(
                "vllm_ascend",
                ascend,
                "vLLM Ascend backend plugin",
                "https://github.com/vllm-project/vllm-ascend",
                "vLLM-Ascend team",
                [
                    "decorator",
                    "einops",
                    "numpy<2.0.0",
                    "packaging",
                    "pip",
                    "pybind11",
                    "pyyaml",
                    "scipy",
                    "setuptools>=64",
                    "setuptools-scm>=8",
                    "torch-npu==2.7.1",
                    "torch==2.7.1",
                    "torchvision",
                    "wheel",
                    "msgpack",
                    "quart",
                    "numba",
                    "opencv-python-headless<=4.11.0.86",
                ],
                note,
            ),
            f"vllm_ascend-{ascend}.dist-info/entry_points.txt": "[vllm.general_plugins]\n"
            "ascend_enhanced_model = vllm_ascend:register_model\n"
            "ascend_kv_connector = vllm_ascend:register_connector\n\n"
            "[vllm.platform_plugins]\nascend = vllm_ascend:register\n",
            f"vllm_ascend-{ascend}.dist-info/top_level.txt": "vllm_ascend\n",
            f"vllm_ascend-{ascend}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: setuptools (80.9.0)\n"
            "Root-Is-Purelib: false\nTag: cp311-cp311-linux_aarch64\n\n",
            f"vllm_ascend-{ascend}.dist-info/INSTALLER": "pip\n",
        },
        f"pip-{PIP_VERSION}": {
            "pip/__init__.py": shim,
            "pip/__main__.py": PIP_MAIN,
            f"pip-{PIP_VERSION}.dist-info/METADATA": _metadata(
                "pip",
                PIP_VERSION,
                "The PyPA recommended tool for installing Python packages.",
                "https://pip.pypa.io/",
                "The pip developers",
                [],
                note,
            ),
            f"pip-{PIP_VERSION}.dist-info/entry_points.txt": "[console_scripts]\npip = pip._internal.cli.main:main\n"
            "pip3 = pip._internal.cli.main:main\n",
            f"pip-{PIP_VERSION}.dist-info/top_level.txt": "pip\n",
            f"pip-{PIP_VERSION}.dist-info/INSTALLER": "pip\n",
            "../../../bin/pip": _script("pip"),
            "../../../bin/pip3": _script("pip"),
        },
    }


def _script(module: str) -> str:
    """A console script the way pip writes one."""
    return (
        f"#!/usr/bin/python{PY}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom {module} import main\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(main())\n"
    )


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_site_packages(site: Path, versions: Mapping[str, str] | None = None) -> dict[str, str]:
    """Install the vllm, vllm_ascend and pip stand-ins with their dist-info into `site`.

    Console scripts go to `site/../../../bin` (so `/usr/local/bin` for the image's site).
    Returns the versions used.
    """
    chosen = resolve_versions(versions)
    for dist, files in _packages(chosen).items():
        record = []
        for rel, text in files.items():
            data = text.encode() if isinstance(text, str) else text
            path = site / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if rel.startswith("../../../bin/"):
                path.chmod(0o755)
            record.append(f"{rel},{_record_hash(data)},{len(data)}")
        record.append(f"{dist}.dist-info/RECORD,,")
        (site / f"{dist}.dist-info" / "RECORD").write_text("\n".join(sorted(record)) + "\n")
    return chosen


# --------------------------------------------------------------------------- root filesystem


def _shared_libraries(files: list[Path]) -> list[str]:
    """Absolute paths (as the loader looks them up) of every library `files` need."""
    out = run(["ldd", *map(str, files)], timeout=60).stdout
    libs: set[str] = set()
    for line in out.splitlines():
        line = line.strip()
        if "not found" in line:
            raise BedError(f"ldd: a library of the Python runtime is missing: {line}")
        if "=>" in line:
            target = line.split("=>", 1)[1].split("(")[0].strip()
            if target:
                libs.add(target)
        elif line.startswith("/") and "(" in line:
            libs.add(line.split("(")[0].strip())  # the dynamic loader
    return sorted(libs)


def _copy_stdlib(dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in SKIP_ANY}
        if Path(folder) == STDLIB:
            skip |= {n for n in names if n in SKIP_TOP}
        if Path(folder).name == "lib-dynload":
            skip |= {n for n in names if n.split(".", 1)[0] in SKIP_DYNLOAD}
        return skip

    shutil.copytree(STDLIB, dest, symlinks=True, ignore=ignore)


def build_rootfs(dest: Path, versions: Mapping[str, str] | None = None) -> dict[str, str]:
    """Lay out the stand-in image's root filesystem in `dest`; returns the versions used."""
    if not PYTHON.exists() or not STDLIB.is_dir():
        raise BedError(
            f"{PYTHON} or {STDLIB} missing: apt-get install python3 ({PYTHON.name} is copied into the image)"
        )
    registry.busybox_rootfs(dest)
    (dest / "bin" / "bash").write_text(
        '#!/bin/sh\n# k3deploy test bed: busybox sh standing in for bash\nexec /bin/sh "$@"\n'
    )
    (dest / "bin" / "bash").chmod(0o755)
    for d in ("usr/bin", "usr/local/bin", "workspace", "root/.cache", "var/tmp"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "usr/bin/env").symlink_to("/bin/busybox")
    shutil.copy2(PYTHON, dest / "usr/bin" / PYTHON.name)
    (dest / "usr/bin/python3").symlink_to(PYTHON.name)
    (dest / "usr/bin/python").symlink_to("python3")
    _copy_stdlib(dest / STDLIB.relative_to("/"))
    modules = sorted((dest / STDLIB.relative_to("/") / "lib-dynload").glob("*.so"))
    for lib in _shared_libraries([PYTHON, *modules]):
        target = dest / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copy2(Path(lib).resolve(), target)
    for script, line in SETUP_SCRIPTS.items():  # what vLLM-Ascend's images source before vllm serve (CANN, ATB)
        path = dest / script.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# k3deploy test-bed stand-in for {script}\n{line}\n")
    chosen = write_site_packages(dest / SITE, versions)
    _precompile(dest)
    (dest / "etc" / "os-release").write_text(
        'PRETTY_NAME="k3deploy test-bed stand-in for vllm-ascend"\nNAME="k3deploy-standin"\nID=k3deploy-standin\n'
    )
    return chosen


def _precompile(root: Path) -> None:
    """Byte-compile just what `vllm` and `pip` import, by importing it once inside the new root.

    A fresh container would otherwise compile those ~80 modules on every start (0.6-1 s here);
    the rest of the standard library stays without __pycache__.
    """
    warm = "import importlib.metadata, runpy, vllm.entrypoints.cli.main, pip, pip.__main__, vllm_ascend"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8", "HOME": "/root"}
    run(["chroot", str(root), f"/usr/bin/python{PY}", "-c", warm], env=env, timeout=120)


def image_changes(versions: Mapping[str, str]) -> list[str]:
    """`podman import --change` instructions: what the real image sets, plus provenance labels."""
    return [
        'CMD ["/bin/bash"]',
        "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "ENV LANG=C.UTF-8",
        "WORKDIR /workspace",
        "LABEL org.opencontainers.image.title=vllm-ascend-k3deploy-standin",
        f"LABEL org.opencontainers.image.version={versions['vllm_ascend']}",
        f"LABEL k3deploy.standin.vllm={versions['vllm']}",
        f"LABEL k3deploy.standin.vllm-ascend={versions['vllm_ascend']}",
    ]


# --------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def cache_key(versions: Mapping[str, str]) -> str:
    """Hash of the inputs: our sources, the versions, and the system files (dpkg status for the rest)."""
    h = hashlib.sha256()
    for src in (HERE / "image.py", HERE / "vllm_standin.py", HERE / "pip_shim.py", Path(registry.__file__)):
        h.update(src.name.encode() + hashlib.sha256(src.read_bytes()).digest())
    h.update(json.dumps(dict(sorted(versions.items()))).encode())
    for path in (PYTHON, BUSYBOX, STDLIB, Path("/var/lib/dpkg/status")):
        with contextlib.suppress(OSError):
            st = path.stat()
            h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def _tar_filter(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def rootfs_archive(versions: Mapping[str, str] | None = None, where: Path | None = None) -> tuple[Path, bool]:
    """The root filesystem as a tar in the cache (built when missing); returns (path, was_cached)."""
    chosen = resolve_versions(versions)
    folder = where or cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / f"standin-{cache_key(chosen)[:20]}.tar"
    if archive.exists():
        os.utime(archive)
        return archive, True
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
    try:
        build_rootfs(work / "rootfs", chosen)
        with tarfile.open(work / "rootfs.tar", "w") as tar:
            tar.add(work / "rootfs", arcname=".", filter=_tar_filter)
        os.replace(work / "rootfs.tar", archive)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    old = sorted(folder.glob("standin-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in old[KEEP_ARCHIVES:]:
        stale.unlink(missing_ok=True)
    return archive, False


def build_and_push(
    ref: str, state_dir: Path, versions: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None
) -> StandinImage:
    """Build the stand-in image as `ref` with the bed's builder, push it, and describe it; `env` is set in the
    image (K3SIM_* controls baked in: an image that misbehaves wherever it runs)."""
    chosen = resolve_versions(versions)
    archive, cached = rootfs_archive(chosen)
    changes = image_changes(chosen) + [f"ENV {key}={value}" for key, value in sorted((env or {}).items())]
    image_id = registry.import_archive(archive, ref, state_dir, changes)
    digest = registry.push_image(ref, state_dir)
    how = "imported the cached root filesystem" if cached else "built the root filesystem"
    return StandinImage(ref, image_id, digest, chosen, archive.stat().st_size, f"{how}, pushed")


# --------------------------------------------------------------------------- registry snapshot
#
# Importing and pushing (gzip) the 37 MB root filesystem costs 4-6 s on a 2-core machine,
# every `testbed up`. After one push the registry's own files for the image (its blobs and
# the repository's link files, Distribution's documented filesystem layout) are kept in the
# cache and put back into the fresh registry next time; a HEAD of the manifest and of every
# blob then proves the registry serves them, else the image is built and pushed as usual.


def _repo_and_tag(ref: str) -> tuple[str, str]:
    path = ref.split("/", 1)[1]
    repo, _, tag = path.rpartition(":")
    return repo, tag


def _registry_v2(state_dir: Path) -> Path:
    return state_dir / "registry" / "data" / "docker" / "registry" / "v2"


def _snapshot_dir(ref: str, versions: Mapping[str, str]) -> Path:
    h = hashlib.sha256(f"{cache_key(versions)}|{ref}".encode())
    with contextlib.suppress(OSError):
        st = Path(shutil.which("docker-registry", path="/usr/bin:/usr/local/bin") or "/usr/bin/docker-registry").stat()
        h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return cache_dir() / f"registry-{h.hexdigest()[:20]}"


def _blob(v2: Path, digest: str) -> Path:
    hexd = digest.split(":", 1)[1]
    return v2 / "blobs" / "sha256" / hexd[:2] / hexd / "data"


def _save_snapshot(v2: Path, repo: str, image: StandinImage, snap: Path) -> None:
    repo_dir = v2 / "repositories" / repo
    layers = sorted({link.read_text().strip() for link in repo_dir.glob("_layers/sha256/*/link")})  # + config
    manifests = sorted({link.read_text().strip() for link in repo_dir.glob("_manifests/revisions/sha256/*/link")})
    blobs = sorted({*layers, *manifests})
    snap.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".snap-", dir=snap.parent))
    try:
        shutil.copytree(repo_dir, work / "v2" / "repositories" / repo, ignore=shutil.ignore_patterns("_uploads"))
        for digest in blobs:
            target = _blob(work / "v2", digest)
            target.parent.mkdir(parents=True)
            shutil.copy2(_blob(v2, digest), target)
        meta = {"ref": image.ref, "id": image.id, "digest": image.digest, "versions": image.versions,
                "size": image.size, "blobs": blobs, "layers": layers}  # fmt: skip
        (work / "image.json").write_text(json.dumps(meta, indent=1) + "\n")
        shutil.rmtree(snap, ignore_errors=True)
        os.replace(work, snap)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    old = sorted(snap.parent.glob("registry-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in old[KEEP_ARCHIVES:]:
        shutil.rmtree(stale, ignore_errors=True)


def _restore_snapshot(snap: Path, v2: Path, repo: str) -> StandinImage | None:
    """Put a snapshot into a registry that lacks `repo`; None when it is unusable."""
    try:
        meta = json.loads((snap / "image.json").read_text())
        digest, layers = str(meta["digest"]), [str(d) for d in meta["layers"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (v2 / "repositories" / repo).exists():
        return None
    for src in sorted((snap / "v2").rglob("*")):
        dst = v2 / src.relative_to(snap / "v2")
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
        elif "blobs" in src.relative_to(snap / "v2").parts[:1]:
            if not dst.exists():
                try:
                    os.link(src, dst)  # blobs are content-addressed and never written in place
                except OSError:
                    shutil.copy2(src, dst)
        else:
            shutil.copy2(src, dst)  # link files are rewritten in place by later pushes: copies
    served = registry.has_content(repo, "manifests", digest) and all(
        registry.has_content(repo, "blobs", d) for d in layers
    )
    if not served:
        shutil.rmtree(v2 / "repositories" / repo, ignore_errors=True)
        return None
    os.utime(snap)
    return StandinImage(meta["ref"], meta["id"], meta["digest"], meta["versions"], meta["size"], "from the cache")


def publish(ref: str, state_dir: Path, versions: Mapping[str, str] | None = None) -> StandinImage:
    """Make `ref` (in the bed registry, which must be running) the stand-in image; cached when possible."""
    chosen = resolve_versions(versions)
    repo, _tag = _repo_and_tag(ref)
    v2 = _registry_v2(state_dir)
    snap = _snapshot_dir(ref, chosen)
    if (snap / "image.json").exists():
        restored = _restore_snapshot(snap, v2, repo)
        if restored is not None:
            return restored
    fresh = not (v2 / "repositories" / repo).exists()
    image = build_and_push(ref, state_dir, chosen)
    if fresh:  # only the image just pushed is in that repository: worth keeping
        _save_snapshot(v2, repo, image, snap)
    return image
