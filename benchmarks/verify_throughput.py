"""Checkpoint verification speed: ours against sha256sum and single-thread hashlib, same files.

    python -m benchmarks.verify_throughput [--files 8] [--mib 256] [--dir /var/tmp/k3-verify-bench]

Files are written once and read once before timing (warm page cache: this measures hashing,
not the disk). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from k3deploy.tasks.models.listing import Listing, RemoteFile
from k3deploy.tasks.node.node_agent import sha256_file, verify_checkpoint

PEAK_RSS = (
    "import resource,sys; from pathlib import Path; from tasks.node.node_agent import sha256_file;"
    "sha256_file(Path(sys.argv[1])); print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
)


def make_files(root: Path, count: int, mib: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    block = os.urandom(1024 * 1024)
    for i in range(count):
        path = root / f"model-{i:05d}.safetensors"
        if not path.exists() or path.stat().st_size != mib * 1024 * 1024:
            with path.open("wb") as f:
                for j in range(mib):
                    f.write(block[j % 251 :] + block[: j % 251])
        paths.append(path)
    return paths


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/k3-verify-bench"))
    args = parser.parse_args()
    paths = make_files(args.dir, args.files, args.mib)
    total = sum(p.stat().st_size for p in paths)
    gb = total / 1e9
    for p in paths:  # warm the page cache
        with p.open("rb") as f:
            while f.read(1 << 24):
                pass
    digests = {p.name: sha256_file(p) for p in paths}
    listing = Listing(
        "bench/ckpt", "0" * 40, tuple(RemoteFile(n, total // len(paths), d, None) for n, d in digests.items())
    )

    rows = []
    t = timed(lambda: subprocess.run(["sha256sum", *map(str, paths)], check=True, capture_output=True))
    rows.append(("`sha256sum` (coreutils, one process)", t))
    t = timed(lambda: [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths[:2]]) * len(paths) / 2
    rows.append(("hashlib, whole file in memory, 1 thread (2 files, scaled)", t))
    single = timed(lambda: verify_checkpoint(args.dir, listing, threads=1))
    rows.append(("ours, 1 thread (8 MiB readinto buffer)", single))
    for threads in (2, 4):
        rows.append(
            (f"ours, {threads} threads", timed(lambda n=threads: verify_checkpoint(args.dir, listing, threads=n)))
        )
    _, manifest, _ = verify_checkpoint(args.dir, listing, threads=2)
    rever = timed(lambda: verify_checkpoint(args.dir, listing, manifest, threads=2))

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{len(paths)} files × {args.mib} MiB = {gb:.2f} GB, warm cache")  # fmt: skip
    print("\n| method | seconds | GB/s | vs ours 1 thread |\n|---|---:|---:|---:|")
    for name, secs in rows:
        print(f"| {name} | {secs:.2f} | {gb / secs:.2f} | {single / secs:.2f}× |")
    print(f"\nre-verify of the unchanged tree with its manifest: {rever * 1000:.1f} ms "
          f"= {100 * rever / single:.3f} % of a full 1-thread hash")  # fmt: skip

    print("\n| file hashed | peak RSS of the hashing process |\n|---:|---:|")
    for mib in (64, args.mib * 4):
        big = args.dir / f"rss-{mib}.bin"
        make_files(args.dir / "rss", 1, mib)[0].rename(big)
        rss = subprocess.run([sys.executable, "-c", PEAK_RSS, str(big)], capture_output=True, text=True, check=True)
        print(f"| {mib} MiB | {int(rss.stdout) / 1024:.1f} MiB |")
        big.unlink()
    shutil.rmtree(args.dir / "rss", ignore_errors=True)


if __name__ == "__main__":
    main()
