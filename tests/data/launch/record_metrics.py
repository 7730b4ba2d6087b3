"""Record the REAL vLLM's /metrics while requests run, with one DP rank stuck, as the stall detector's data.

Run against the local profile left up (`k3deploy run -c configs/local.yaml --only launch --keep-serving`):

    python3 tests/data/launch/record_metrics.py --config configs/local.yaml

With both ranks working: a reading while requests run (`running-1.txt`), a later one (`running-2.txt`),
one after they ended (`idle.txt`). Then requests are sent again and, once DP rank 1 runs some,
EngineCore_DP1 is stopped (SIGSTOP: a hung engine keeps its process and /health): two readings
`stuck-1.txt`, `stuck-2.txt` taken seconds apart, then the engine is continued (SIGCONT).
Written to `vllm-<version>/metrics/` here.

What the recording showed: a stopped engine's figures are the last it reported. Stopped while it ran
requests, its `num_requests_running` stays above zero and its token counters stand still; stopped
while idle, it shows 0 running, and requests routed to it later never appear in /metrics at all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx

from k3deploy.blocks.loader import load_config
from k3deploy.tasks.endpoints import service_url
from k3deploy.tasks.watch.stall import readings

HERE = Path(__file__).resolve().parent


def fire(url: str, model: str, count: int, max_tokens: int) -> list[threading.Thread]:
    def one(i: int) -> None:
        body = {"model": model, "prompt": f"Count slowly {i}:", "max_tokens": max_tokens, "ignore_eos": True}
        with contextlib.suppress(httpx.HTTPError):  # a request to the stopped engine is cut when recording ends
            httpx.post(f"{url}/v1/completions", json=body, timeout=600)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return threads


def wait_for(url: str, test, what: str, deadline_s: float = 120) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        if test(readings(text)):
            return text
        time.sleep(0.2)
    raise SystemExit(f"gave up waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    cfg = load_config(args.config)
    url, model = service_url(cfg), cfg.serve.served_model_name
    version = httpx.get(f"{url}/version", timeout=30).json()["version"]
    folder = HERE / f"vllm-{re.sub(r'[^0-9A-Za-z.+_-]', '_', version)}" / "metrics"
    folder.mkdir(parents=True, exist_ok=True)

    threads = fire(url, model, 4, 1500)
    first = wait_for(url, lambda r: sum(e.running for e in r.values()) >= 2, "requests running")
    (folder / "running-1.txt").write_text(first)
    before = readings(first)
    second = wait_for(url, lambda r: all(r[e].tokens > before[e].tokens for e in before if before[e].running),
                      "tokens to move")  # fmt: skip
    (folder / "running-2.txt").write_text(second)
    for t in threads:
        t.join()
    (folder / "idle.txt").write_text(wait_for(url, lambda r: all(e.running == 0 for e in r.values()), "idle"))

    pid = int(subprocess.run(["pgrep", "-f", "EngineCore_DP1"], capture_output=True, text=True).stdout.split()[0])
    fire(url, model, 4, 1500)
    wait_for(url, lambda r: r.get("1") is not None and r["1"].running >= 1, "requests on engine 1")
    os.kill(pid, signal.SIGSTOP)
    try:
        (folder / "stuck-1.txt").write_text(httpx.get(f"{url}/metrics", timeout=30).text)
        time.sleep(5)  # recording only: the stuck engine's counters must not move in these seconds
        (folder / "stuck-2.txt").write_text(httpx.get(f"{url}/metrics", timeout=30).text)
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"written to {folder}")


if __name__ == "__main__":
    main()
