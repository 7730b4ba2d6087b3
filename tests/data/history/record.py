"""Record a REAL run history of the local profile, as test data for the regression verdicts.

    python3 tests/data/history/record.py --runs 6 --changed 2

Runs `k3deploy run -c configs/local.yaml` (the whole pipeline: real vLLM, real `vllm bench serve`)
`--runs` times unchanged, then `--changed` times with a real step change in the config (serve.max_num_seqs
4 → 1 and both ranks' OpenMP threads bound to core 0, `serve.env.VLLM_CPU_OMP_THREADS_BIND` nobind → 0,
as vLLM's `auto` would: about 4× slower here), each into a scratch runs store, and keeps every run record
here as `local-cpu/NN-<unchanged|changed>.json`, oldest first. Record on an otherwise idle machine: a
nightly cluster is not shared with a test suite either.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]


def change(data: dict[str, Any]) -> None:
    data["serve"]["max_num_seqs"] = 1
    data["serve"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] = "0"


def run(config: Path, runs: Path) -> Path:
    """One whole local-profile run; the path of its record."""
    subprocess.run(["k3deploy", "run", "-c", str(config), "--runs-dir", str(runs)], cwd=ROOT, check=False)
    records = sorted(runs.glob("*/record.json"), key=lambda p: p.stat().st_mtime)
    return records[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="unchanged runs")
    parser.add_argument("--changed", type=int, default=2, help="runs with the config change")
    args = parser.parse_args()
    out = HERE / "local-cpu"
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        data = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
        unchanged = base / "local.yaml"
        unchanged.write_text(yaml.safe_dump(data))
        change(data)
        changed = base / "changed.yaml"
        changed.write_text(yaml.safe_dump(data))
        plan = [(unchanged, "unchanged")] * args.runs + [(changed, "changed")] * args.changed
        for n, (config, label) in enumerate(plan):
            record = run(config, base / "runs")
            shutil.copy(record, out / f"{n:02d}-{label}.json")
            print(f"{n:02d}-{label}: {record}")


if __name__ == "__main__":
    main()
