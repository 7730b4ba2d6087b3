"""Where runs keep their files: the runs store and one folder per run.

Part of the base layer (it imports nothing of the project), so that every layer can find a run's folder
the same way: tasks (a stage's logs), flows (bench and accuracy outputs), the record and the CLI.
"""

from __future__ import annotations

import os
from pathlib import Path


def runs_dir() -> Path:
    """The runs store: $K3DEPLOY_RUNS_DIR, else ./runs; one folder per run (record, logs)."""
    return Path(os.environ.get("K3DEPLOY_RUNS_DIR", "runs"))


def run_folder(run_id: str, part: str | None = None) -> Path:
    """The folder of one run (its root flow run's id), or of one part of it: `logs`, `bench`, `accuracy`."""
    folder = runs_dir() / run_id
    return folder / part if part else folder
