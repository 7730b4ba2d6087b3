"""The soak's I/O: windows of steady load, each a real `vllm bench serve` run (the bench stage's own task), until
`soak.minutes` of windows are done; after each, every rank's memory is read and the window judged at once.

Each window's saved JSON and its memory reading (`*.memory.json`, written before the JSON marks the window done)
go to the run's soak folder, so a Retry of the run — after a failure, a cancellation or a worker that died — takes
the windows already judged over and runs only the minutes left (`restart` starts them over).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks.bench.cells import cell
from k3deploy.tasks.bench.soak import Window, window_failure, window_of
from k3deploy.tasks.bench.soak_memory import read_memory
from k3deploy.tasks.bench.steps import reset_prefix_cache, run_bench, saved_run
from k3deploy.tasks.bench.sweep import served
from k3deploy.tasks.render import Plan, bench_file

WORKLOAD = "random"
MEMORY = ".memory.json"


def min_windows(drift_windows: int) -> int:
    """The fewest windows a soak runs: its first and last `drift.windows` apart, and 3 readings for a memory slope."""
    return max(2 * drift_windows, 3)


def window_config(cfg: DeploymentConfig) -> DeploymentConfig:
    """The bench settings of every window: its prompts and concurrency, one run, no baseline (drift judges)."""
    conf, bench = cfg.soak, cfg.bench
    update = {"num_prompts": conf.window_prompts, "max_concurrency": conf.in_flight(bench.max_concurrency),
              "repeats": 1, "baselines": []}  # fmt: skip
    return cfg.model_copy(update={"bench": bench.model_copy(update=update)})


def _memory_file(folder: Path, concurrency: int, index: int) -> Path:
    return (folder / bench_file(WORKLOAD, concurrency, index)).with_suffix(MEMORY)


@dataclass
class Soak:
    """The windows so far, kept as they end (the stage's record has them however the soak ends)."""

    windows: list[Window] = field(default_factory=list)
    running: int | None = None  # the window under way (a lost rank is named in it)
    failure: str | None = None  # the window that failed the soak at once, and why
    on_window: Callable[[Window], None] = lambda _w: None

    def measure(self, cfg: DeploymentConfig, plan: Plan, folder: Path, stop: threading.Event,
                say: Callable[[str], None], restart: bool = False) -> None:  # fmt: skip
        window_cfg = window_config(cfg)
        concurrency = window_cfg.bench.max_concurrency
        budget_s = cfg.soak.minutes * 60
        needed = min_windows(cfg.soak.drift.windows)  # however fast the minutes go, enough windows to judge drift
        folder.mkdir(parents=True, exist_ok=True)
        if restart:
            for old in folder.glob(f"{WORKLOAD}-c*"):
                old.replace(old.with_name(old.name + ".restarted"))
        index = 0
        while not stop.is_set():
            spent = sum(w.seconds for w in self.windows)
            if spent >= budget_s and len(self.windows) >= needed:
                return
            index += 1
            self.running = index
            window = self._resumed(window_cfg, folder, concurrency, index)
            if window is None:
                window = self._run(window_cfg, plan, folder, concurrency, index, stop)
            self.windows.append(window)
            self.running = None
            self.on_window(window)
            left = max(0.0, budget_s - spent - window.seconds) / 60
            say(f"soak {window.line()}{' (resumed)' if window.resumed else ''}; {left:.1f} of "
                f"{cfg.soak.minutes:g} min left")  # fmt: skip
            self.failure = window_failure(window)
            if self.failure is not None:
                return

    def _resumed(self, cfg: DeploymentConfig, folder: Path, concurrency: int, index: int) -> Window | None:
        run = saved_run(cfg, folder, WORKLOAD, concurrency, index)
        memory_file = _memory_file(folder, concurrency, index)
        if run is None or not memory_file.exists():
            return None
        try:
            kept = json.loads(memory_file.read_text())
        except ValueError as err:
            raise UnreadableEvidence(f"{memory_file}: {err}") from None
        judged = cell([run], cfg.bench.validity, served(cfg), [])
        return window_of(index, judged, kept["ended_at"], kept["seconds"], kept["memory"], resumed=True)

    def _run(self, cfg: DeploymentConfig, plan: Plan, folder: Path, concurrency: int, index: int,
             stop: threading.Event) -> Window:  # fmt: skip
        if cfg.bench.reset_prefix_cache and cfg.serve.enable_prefix_caching:
            reset_prefix_cache(cfg)
        began = time.monotonic()
        run = run_bench(cfg, plan, WORKLOAD, concurrency, folder, stop, index)
        seconds = time.monotonic() - began
        memory = read_memory(cfg, plan)
        ended = time.time()
        # the memory is written second: a window counts as done (and is resumed) only with both
        reading = {"ended_at": ended, "seconds": round(seconds, 3), "memory": memory}
        _memory_file(folder, concurrency, index).write_text(json.dumps(reading) + "\n")
        judged = cell([run], cfg.bench.validity, served(cfg), [])
        return window_of(index, judged, ended, seconds, memory, resumed=False)


def as_dict(w: Window) -> dict[str, Any]:
    return asdict(w)
