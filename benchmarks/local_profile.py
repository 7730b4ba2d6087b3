"""The local profile's first and second run, stage by stage, and the pipeline's own overhead.

Runs `k3deploy run -c configs/local.yaml` as a user does (a fresh process each time), reads each
run's record, and splits the wall time into what is not ours (installing vLLM's environment,
downloading the checkpoint, vLLM's start-up until ready, the readiness and smoke requests, the
`vllm bench serve` runs) and the rest:
the pipeline's own overhead (Prefect, SSH/local exec, checks, records). `--fresh` first removes
the environment, the checkpoint and the hub's store, so the first run pays for all of them.

    python3 -m benchmarks.local_profile [--fresh] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from k3deploy.blocks.loader import load_config
from k3deploy.records.record import RunRecord

ROOT = Path(__file__).parents[1]
PROFILE = ROOT / "configs" / "local.yaml"


def one_run(runs: Path) -> tuple[float, RunRecord]:
    before = set(runs.glob("*")) if runs.exists() else set()
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "k3deploy", "run", "-c", str(PROFILE), "--runs-dir", str(runs)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"the run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (folder,) = set(runs.glob("*")) - before
    return wall, RunRecord.model_validate_json((folder / "record.json").read_text())


def split(wall: float, record: RunRecord, made_environment: bool) -> dict[str, Any]:
    stages = {s.stage: s for s in record.stages}
    launch = stages["launch"].data
    ready = float(launch.get("time_to_ready_s") or 0.0)
    requests = stages["launch"].seconds - ready  # starting the processes, the readiness burst
    fetched = any(
        row.get("downloaded files") for c in stages["models"].data.get("checkpoints", []) for row in c["nodes"]
    )
    outside = {
        "environment install": stages["image"].seconds if made_environment else 0.0,
        "checkpoint download (models stage)": stages["models"].seconds if fetched else 0.0,
        "vLLM start-up until ready": ready,
        "readiness requests": requests,
        "smoke requests": sum(c["seconds"] for c in stages["smoke"].data.get("checks", [])) if "smoke" in stages else 0,
        "vllm bench serve runs": sum(r.get("tool_seconds") or 0 for r in stages["bench"].data.get("runs", []))
        if "bench" in stages
        else 0,
    }
    return {
        "wall_s": round(wall, 1),
        "stages_s": {name: s.seconds for name, s in stages.items()},
        "outside_s": {k: round(v, 1) for k, v in outside.items()},
        "overhead_s": round(wall - sum(outside.values()), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fresh", action="store_true", help="remove the environment, checkpoint and hub store first")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    cfg = load_config(PROFILE)
    if args.fresh:
        assert cfg.models.local_hub is not None
        for path in (cfg.image.environment.path, cfg.models.target.path, cfg.models.local_hub.root):
            shutil.rmtree(path, ignore_errors=True)
    runs = Path(tempfile.mkdtemp(prefix="k3bench-runs-"))
    results = []
    for i in range(args.runs):
        wall, record = one_run(runs)
        results.append(split(wall, record, made_environment=args.fresh and i == 0))
        print(json.dumps(results[-1]), flush=True)
    names = list(results[0]["stages_s"])
    print("\n| run | wall (s) | " + " | ".join(names) + " | outside the pipeline (s) | overhead (s) |")
    print("|---|---:|" + "---:|" * (len(names) + 2))
    for i, r in enumerate(results, 1):
        cells = " | ".join(f"{r['stages_s'][n]:.1f}" for n in names)
        print(f"| {i} | {r['wall_s']} | {cells} | {sum(r['outside_s'].values()):.1f} | {r['overhead_s']} |")


if __name__ == "__main__":
    main()
