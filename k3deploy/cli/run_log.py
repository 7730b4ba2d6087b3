"""Where a CLI run's Prefect log stream goes: the run's log file and the UI, not the terminal.

The terminal shows k3deploy's stage lines and the final table; Prefect's INFO stream (hundreds of
lines per run) and the tracebacks it logs for an expected failure would bury them. Prefect's API
handler is left alone, so the UI still shows every line; `--verbose` keeps them on the terminal too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

FORMAT = "%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s"
CONSOLE_LOGGERS = ("", "uvicorn", "fastapi")  # where Prefect's logging.yml puts its console handler


@contextlib.contextmanager
def prefect_log(path: Path, verbose: bool = False) -> Iterator[Path]:
    """Every log record of the command into `path`; Prefect's console handlers quiet unless `verbose`."""
    from prefect.logging.formatters import PrefectFormatter
    from prefect.logging.handlers import PrefectConsoleHandler

    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(
        PrefectFormatter(
            format=FORMAT,
            datefmt="%H:%M:%S",
            flow_run_fmt="%(asctime)s.%(msecs)03d | %(levelname)-7s | Flow run %(flow_run_name)r - %(message)s",
            task_run_fmt="%(asctime)s.%(msecs)03d | %(levelname)-7s | Task run %(task_run_name)r - %(message)s",
        )
    )
    consoles = [
        handler
        for name in CONSOLE_LOGGERS
        for handler in logging.getLogger(name).handlers
        if isinstance(handler, PrefectConsoleHandler)
    ]
    levels = [handler.level for handler in consoles]
    if not verbose:
        for handler in consoles:
            handler.setLevel(logging.CRITICAL + 1)
    root = logging.getLogger()
    root.addHandler(to_file)
    try:
        yield path
    finally:
        root.removeHandler(to_file)
        to_file.close()
        for handler, level in zip(consoles, levels, strict=True):
            handler.setLevel(level)
