"""Launch log watching: lines/s and peak memory of LogWatcher + LogBuffer, and the pre-filter against a plain loop.

    python -m benchmarks.log_buffer [--sizes 1000000 2000000 5000000] [--max-lines 10000] [--dir /var/tmp/k3-logbench]

Each size runs in a fresh process (peak RSS never goes down, so sizes must not share one) that
feeds a realistic serving log (node 0 start-up, then access-log, engine-stats, spec-decode and
request lines from a pool of distinct lines) through `LogWatcher.feed` and `LogBuffer.append`
(writing the per-node file). Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

from k3deploy.tasks.watch.logwatch import LogBuffer, LogWatcher, load_patterns

STARTUP = [
    "INFO 06-23 13:44:05 [__init__.py:235] Platform plugin ascend is activated",
    "(APIServer pid=1) INFO 06-23 13:44:10 [api_server.py:1896] vLLM API server version 0.11.0rc3",
    "(EngineCore_DP0 pid=2876) INFO 06-23 13:44:22 [core.py:412] Waiting for init message from front-end.",
    "Loading safetensors checkpoint shards:  50% Completed | 32/64 [05:10<05:10,  9.70s/it]",
    "(Worker_TP0 pid=3311) INFO 06-23 13:55:02 [default_loader.py:267] Loading weights took 626.84 seconds",
    "(Worker_TP0 pid=3311) INFO 06-23 13:55:40 [worker_v1.py:271] Available KV cache memory: 14.36 GiB",
    "(EngineCore_DP0 pid=2876) INFO 06-23 13:55:41 [kv_cache_utils.py:1087] GPU KV cache size: 412,672 tokens",
    "(Worker_TP0 pid=3311) INFO 06-23 13:56:23 [model_runner_v1.py:3302] Graph capturing finished in 38 secs",
    "(APIServer pid=1) INFO:     Application startup complete.",
]


def serving_pool(size: int = 20_000, seed: int = 7) -> list[str]:
    """Distinct serving-time lines in the proportions a busy node 0 prints them."""
    rng = random.Random(seed)
    pool = []
    for i in range(size):
        stamp = f"06-23 {14 + i // 3600 % 10:02d}:{i // 60 % 60:02d}:{i % 60:02d}"
        kind = rng.random()
        if kind < 0.60:
            ip, port = f"10.0.{rng.randrange(4)}.{rng.randrange(2, 250)}", rng.randrange(30000, 60000)
            path = rng.choice(["/v1/chat/completions", "/v1/completions", "/health", "/metrics"])
            pool.append(f'(APIServer pid=1) INFO:     {ip}:{port} - "POST {path} HTTP/1.1" 200 OK')
        elif kind < 0.75:
            pool.append(
                f"(APIServer pid=1) INFO {stamp} [loggers.py:123] Engine {rng.randrange(4):03d}: "
                f"Avg prompt throughput: {rng.uniform(0, 9e4):.1f} tokens/s, Avg generation throughput: "
                f"{rng.uniform(0, 4e3):.1f} tokens/s, Running: {rng.randrange(64)} reqs, Waiting: "
                f"{rng.randrange(8)} reqs, GPU KV cache usage: {rng.uniform(0, 99):.1f}%, Prefix cache hit rate: "
                f"{rng.uniform(0, 90):.1f}%"
            )
        elif kind < 0.85:
            pool.append(
                f"(EngineCore_DP{rng.randrange(4)} pid=2876) INFO {stamp} [metrics.py:96] SpecDecoding metrics: "
                f"Mean acceptance length: {rng.uniform(1, 7):.2f}, Accepted throughput: {rng.uniform(0, 900):.1f} "
                f"tokens/s, Drafted throughput: {rng.uniform(0, 1800):.1f} tokens/s, Accepted: "
                f"{rng.randrange(99999)} tokens, Drafted: {rng.randrange(99999)} tokens"
            )
        elif kind < 0.97:
            pool.append(
                f"(APIServer pid=1) INFO {stamp} [logger.py:43] Received request chatcmpl-{rng.getrandbits(64):016x}: "
                f"params: SamplingParams(n=1, temperature=0.6, top_p=0.95, max_tokens={rng.choice([256, 1024, 4096])}, "
                "skip_special_tokens=True), prompt_token_ids: None, lora_request: None."
            )
        else:
            pool.append(
                f"(APIServer pid=1) WARNING {stamp} [protocol.py:93] The following fields were present in the "
                "request but ignored: {'reasoning_effort'}"
            )
    return pool


def worker(lines: int, max_lines: int, path: Path, keep_all: bool) -> dict[str, float]:
    """Feed `lines` lines in this process; report rate, peak RSS and what was kept."""
    pool = serving_pool()
    watcher = LogWatcher(load_patterns())
    buffer = LogBuffer(max_lines, path)
    kept: list[str] = []
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    for line in STARTUP:
        watcher.feed("node0", 0, line)
        buffer.append(line)
    for i in range(lines - len(STARTUP)):
        line = pool[i % len(pool)] + "\n"  # a new string per line, as a stream delivers them
        watcher.feed("node0", 0, line)
        buffer.append(line)
        if keep_all:
            kept.append(line)
    buffer.close()
    seconds = time.perf_counter() - started
    assert watcher.first_fatal() is None and len(watcher.milestones()["node0"]) == 5
    assert buffer.lines_seen == lines and len(buffer.tail()) == max_lines
    return {
        "seconds": seconds,
        "rss_before_kib": rss_before,
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "file_bytes": path.stat().st_size,
    }


def matcher_rates() -> tuple[list[float], int, int]:
    """Lines/s of the pre-filtered matcher, of a plain loop over every pattern and of one alternation of them all."""
    patterns = load_patterns()
    lines = STARTUP + serving_pool()
    for line in lines:
        assert [p.id for p, _ in patterns.match(line)] == [p.id for p, _ in patterns.naive_match(line)]
    unnamed = (re.sub(r"\(\?P<\w+>", "(?:", p.regex.pattern) for p in patterns.all)
    alternation = re.compile("|".join(f"(?:{pattern})" for pattern in unnamed))
    rates = []
    for fn in (patterns.match, patterns.naive_match, alternation.search):
        best = float("inf")
        for _ in range(3):  # best of 3: this machine is shared
            started = time.perf_counter()
            for line in lines:
                fn(line)
            best = min(best, time.perf_counter() - started)
        rates.append(len(lines) / best)
    return rates, len(patterns.all), len(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 2_000_000, 5_000_000])
    parser.add_argument("--max-lines", type=int, default=10_000)
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/k3-logbench"))
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keep-all", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    if args.worker is not None:
        path = args.dir / f"node0-{args.worker}.log"
        path.unlink(missing_ok=True)
        print(json.dumps(worker(args.worker, args.max_lines, path, args.keep_all)))
        path.unlink()
        return

    def run(lines: int, keep_all: bool = False) -> dict[str, float]:
        argv = [sys.executable, "-m", "benchmarks.log_buffer", "--worker", str(lines), "--dir", str(args.dir)]
        argv += ["--max-lines", str(args.max_lines)] + (["--keep-all"] if keep_all else [])
        return json.loads(subprocess.run(argv, check=True, capture_output=True, text=True).stdout)

    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load "
          f"average {load:.1f} at start; LogBuffer(max_lines={args.max_lines:,}) writing to {args.dir}")  # fmt: skip
    print("\n| lines fed | seconds | lines/s | peak RSS | RSS before feeding | log file |")
    print("|---:|---:|---:|---:|---:|---:|")
    for lines in args.sizes:
        r = run(lines)
        print(f"| {lines:,} | {r['seconds']:.1f} | {lines / r['seconds']:,.0f} | {r['peak_rss_kib'] / 1024:.1f} MiB "
              f"| {r['rss_before_kib'] / 1024:.1f} MiB | {r['file_bytes'] / 1e6:,.0f} MB |")  # fmt: skip
    r = run(args.sizes[0], keep_all=True)
    print(f"| {args.sizes[0]:,}, also kept in a list (for contrast) | {r['seconds']:.1f} | "
          f"{args.sizes[0] / r['seconds']:,.0f} | {r['peak_rss_kib'] / 1024:.1f} MiB | "
          f"{r['rss_before_kib'] / 1024:.1f} MiB | {r['file_bytes'] / 1e6:,.0f} MB |")  # fmt: skip

    (fast, naive, alternation), count, lines = matcher_rates()
    print(f"\n| matcher ({count} patterns, {lines:,} lines, best of 3) | lines/s | vs plain loop |\n|---|---:|---:|")
    print(f"| ours: required-literal pre-filter (one trie regex), the patterns only on a hit | {fast:,.0f} | "
          f"{fast / naive:.1f}× |")  # fmt: skip
    print(f"| plain loop: every pattern's `search` on every line | {naive:,.0f} | 1.0× |")
    print(f"| one alternation of all {count} full patterns (says only *whether* a line matched) | {alternation:,.0f} | "
          f"{alternation / naive:.1f}× |")  # fmt: skip


if __name__ == "__main__":
    main()
