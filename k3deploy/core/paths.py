"""Where runs keep their files: the runs store and one folder per run.

Part of the base layer (it imports nothing of the project), so that every layer can find a run's folder
the same way: tasks (a stage's logs), flows (bench and accuracy outputs), the record and the CLI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def runs_dir() -> Path:
    """The runs store: $K3DEPLOY_RUNS_DIR, else ./runs; one folder per run (record, logs)."""
    return Path(os.environ.get("K3DEPLOY_RUNS_DIR", "runs"))


def run_folder(run_id: str, part: str | None = None) -> Path:
    """The folder of one run (its root flow run's id), or of one part of it: `logs`, `bench`, `accuracy`."""
    folder = runs_dir() / run_id
    return folder / part if part else folder


def read_documents(name: str, model: type[M], root: Path | None = None) -> list[M]:
    """Every readable `<root>/*/<name>` of the runs store as `model` (the bisects, the tunes); one that cannot be
    read is left out: it judges nothing."""
    found = []
    for path in (root or runs_dir()).glob(f"*/{name}"):
        try:
            found.append(model.model_validate_json(path.read_text()))
        except (OSError, ValidationError, ValueError):
            continue
    return found


def write_document(folder_id: str, name: str, document: BaseModel, root: Path | None = None) -> Path:
    """The one writer of the runs store's records (run, bisect, tune): `<root>/<folder_id>/<name>`, written whole
    (a reader, or a worker on another host reading the shared store, never sees half a record)."""
    folder = (root or runs_dir()) / folder_id
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    partial = path.with_name(f"{name}.partial")
    partial.write_text(document.model_dump_json(indent=2) + "\n")
    partial.replace(path)
    return path
