"""The soak's judgement (tasks/bench/soak.py) and its memory readers' parsers (tasks/bench/soak_memory.py,
tasks/runtime.py): windows failing at once, drift of latency and throughput, a rank's memory slope."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from k3deploy.blocks.soak import SoakDrift
from k3deploy.tasks.bench.soak import MIB, Window, drift, figures, slope, window_failure
from k3deploy.tasks.bench.soak_memory import parse_hbm, parse_meminfo
from k3deploy.tasks.runtime import parse_group_rss

pytestmark = pytest.mark.bench
PUBLISHED = Path(__file__).parents[1] / "data" / "comm" / "published"
GIB = 1024 * MIB


def window(i: int, ttft: float = 100.0, e2el: float = 1000.0, tokens: float = 500.0, rss: float = 2 * GIB,
           free: float = 16 * GIB, valid: bool = True) -> Window:  # fmt: skip
    """Window i of 60 s, ending at i minutes, with these figures and rank 0's memory."""
    figures = {"median_ttft_ms": ttft, "median_e2el_ms": e2el, "output_throughput": tokens}
    memory: dict[str, dict[str, int | None]] = {
        "node0 (DP rank 0)": {"bytes": int(rss), "free": int(free), "hbm_used": None, "hbm_total": None}
    }
    return Window(i, 60.0 * i, 60.0, 100 if valid else 97, 100, valid,
                  [] if valid else ["run 1: 97 of 100 requests completed, 3 failed"], figures, 2.0, memory)  # fmt: skip


def rows(windows: list[Window], **kw: object) -> dict[str, tuple[bool, str]]:
    return {f"{r.subject}: {r.check}": (r.ok, r.detail) for r in drift(windows, SoakDrift.model_validate(kw))}


def test_a_window_with_a_failed_request_fails_the_soak_at_once_naming_it():
    assert window_failure(window(3)) is None
    assert window_failure(window(3, valid=False)) == "window 3: run 1: 97 of 100 requests completed, 3 failed"


def test_steady_windows_pass_every_drift_check_with_their_figures():
    noise = random.Random(7)
    windows = [window(i, 100 * noise.uniform(0.9, 1.1), 10 * noise.uniform(0.9, 1.1), 500 * noise.uniform(0.9, 1.1),
                      rss=2 * GIB + noise.randrange(0, 50 * MIB)) for i in range(1, 9)]  # fmt: skip
    judged = rows(windows)
    assert all(ok for ok, _ in judged.values()), judged
    assert "windows 7–8 against 1–2's" in judged["median TTFT: latency drift"][1]
    assert "steady" in judged["node0 (DP rank 0): memory growth"][1]


def test_latency_that_grows_past_its_tolerance_is_drift_with_both_figures():
    windows = [window(i, ttft=100 + 15 * i) for i in range(1, 7)]  # 115 … 190 ms
    ok, said = rows(windows, latency=0.25)["median TTFT: latency drift"]
    assert not ok and said == ("median TTFT 182.5 ms in windows 5–6 against 1–2's 122.5 ms: +49.0%, beyond "
                               "soak.drift.latency 25%")  # fmt: skip
    assert rows(windows, latency=0.5)["median TTFT: latency drift"][0]  # within a looser tolerance


def test_throughput_that_falls_past_its_tolerance_is_drift():
    windows = [window(i, tokens=600 - 40 * i) for i in range(1, 7)]
    ok, said = rows(windows, throughput=0.2)["output throughput: throughput drift"]
    assert not ok and said == ("output throughput 380 tok/s in windows 5–6 against 1–2's 540 tok/s: -29.6%, beyond "
                               "soak.drift.throughput −20%")  # fmt: skip


def test_too_few_windows_are_not_judged_for_drift_and_say_how_many_are_needed():
    judged = drift([window(1), window(2), window(3)], SoakDrift(windows=2))
    speed = [r for r in judged if r.check.endswith("drift")]
    assert all(r.ok and not r.judged for r in speed)
    assert speed[0].detail == "3 window(s): 4 needed to set the last 2 against the first 2"


def test_memory_rising_towards_the_free_memory_within_the_horizon_is_a_leak_named_with_its_slope():
    # 2 GiB, then 600 MiB more each minute after the first; 16 GiB free at the end: gone in ~27 min
    windows = [window(i, rss=2 * GIB + (i - 1) * 600 * MIB, free=16 * GIB) for i in range(1, 7)]
    ok, said = rows(windows)["node0 (DP rank 0): memory growth"]
    assert not ok
    assert said.startswith("5048 MiB at window 6, +3000 MiB since window 1, slope +36000.0 MiB/h over windows 2–6")
    assert "the 16384 MiB still free would be gone in 0.5 h, within soak.drift.memory_horizon_hours 24" in said
    # the same growth with a horizon shorter than it: not a leak to this site
    assert rows(windows, memory_horizon_hours=0.25)["node0 (DP rank 0): memory growth"][0]


def test_a_first_window_warming_the_allocator_up_is_not_a_leak():
    windows = [window(1, rss=1 * GIB), *[window(i, rss=3 * GIB + i * MIB) for i in range(2, 7)]]
    ok, said = rows(windows)["node0 (DP rank 0): memory growth"]
    assert ok and "slope +60.0 MiB/h over windows 2–6" in said  # +2 GiB in window 1, then 1 MiB a minute: steady


def test_npu_hbm_growth_is_judged_against_the_hbm_left_on_the_npus():
    windows = []
    for i in range(1, 6):
        w = window(i)
        w.memory["node0 (DP rank 0)"] |= {"hbm_used": (40 + i) * GIB, "hbm_total": 64 * GIB}
        windows.append(w)
    ok, said = rows(windows)["node0 (DP rank 0): NPU HBM growth"]
    assert not ok and "the 19456 MiB still free would be gone in 0.3 h" in said


def test_the_slope_is_least_squares_and_the_record_figures_count_what_was_done():
    assert slope([(0, 0), (60, 60), (120, 120)]) == pytest.approx(1.0)
    assert slope([(0, 10), (60, 10)]) == 0.0
    done = [window(1), window(2, valid=False)]
    shown = figures(done, drift(done, SoakDrift(windows=1)), 10)
    assert shown["windows"] == 2 and shown["minutes"] == 2.0 and shown["requests"] == 197
    assert shown["planned_minutes"] == 10


def test_memory_parsers_read_real_outputs():
    # a real A3's `npu-smi info` (published, tests/data/comm/published/npu-smi-info-a3.txt): 16 dies of 64 GiB
    used, total = parse_hbm((PUBLISHED / "npu-smi-info-a3.txt").read_text()) or (0, 0)
    assert total == 16 * 65536 * MIB and used == 52927 * MIB  # the HBM-Usage column's 16 "used / total" summed
    assert parse_hbm("npu-smi: command not found") is None
    assert parse_meminfo(Path("/proc/meminfo").read_text().split("MemAvailable:")[1].split()[0]) > 0
    assert parse_meminfo("") is None
    assert parse_group_rss("5252\n") == 5252 * 1024 and parse_group_rss("") is None
