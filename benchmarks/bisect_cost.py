"""What a bisect cost in cluster time, against relaunching the whole pipeline once per experiment by hand.

Reads every bisect record of a runs store and the run records of its two ends: the bisect's node-hours
(preflight once, then each experiment from launch to the judged stage, models/comm/image reused), what
the reuse saved, and the alternative — one whole validate run per experiment, costed as the mean of the
two ends' own runs (the same pipeline, the same machine).

    python3 -m benchmarks.bisect_cost RUNS_DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

from k3deploy.records.bisect_record import BISECT_NAME, BisectRecord
from k3deploy.records.record import read_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path)
    runs = parser.parse_args().runs
    print("| bisect | verdict | experiments | bisect node-h | saved node-h | whole runs node-h | ratio |")
    print("|---|---|---|---|---|---|---|")
    for path in sorted(runs.glob(f"*/{BISECT_NAME}")):
        record = BisectRecord.model_validate_json(path.read_text())
        ends = [read_record(record.good_run, runs), read_record(record.bad_run, runs)]
        whole = sum(r.cluster_hours for r in ends) / 2 * len(record.experiments)
        verdict = record.outcome.verdict.value if record.outcome else "unfinished"
        ratio = record.cluster_hours / whole if whole else float("nan")
        print(f"| {record.bisect_id[:8]} | {verdict} | {len(record.experiments)} | {record.cluster_hours:.4f} | "
              f"{record.saved_cluster_hours:.4f} | {whole:.4f} | {ratio:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
