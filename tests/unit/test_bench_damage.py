"""No damaged bench result is ever a VALID cell, and the undamaged real ones still are.

The real saved results of `vllm bench serve` 0.32.0 on the local profile (tests/data/bench: 20 prompts of 16
tokens at concurrency 2, `--ignore-eos`), damaged at random in every way a broken tool, a lying client or a
server that cuts answers short would: a time's sign flipped, a figure zeroed, percentiles swapped or scaled out of
order, a latency past the run, counts that agree with each other but not with the plan (consistently recomputed,
so only the plan catches them), outputs shortened with every throughput recomputed to match, the model or the
concurrency changed, a key given twice. Each damaged result is either unreadable evidence (UnreadableEvidence,
naming the figure) or a cell judged INVALID with its reason; never VALID.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3deploy.blocks.bench import Validity
from k3deploy.core.errors import UnreadableEvidence
from k3deploy.tasks.bench.cells import Serving, cell
from k3deploy.tasks.bench.consistency import LATENCIES
from k3deploy.tasks.bench.results import parse_result
from tests.bench_results import recounted

pytestmark = pytest.mark.bench
DATA = Path(__file__).parents[1] / "data" / "bench"
REAL = {
    "random": (DATA / "vllm-0.32.0-random-c2.json").read_text(),
    "prefix_repetition": (DATA / "vllm-0.32.0-prefix_repetition-c2.json").read_text(),
    "random (--save-detailed)": (DATA / "vllm-0.32.0-random-c2-detailed.json").read_text(),
}
# the cache readings of a cold and a prefix-hit run (of 1000)
HITS = {"random": 0.0, "prefix_repetition": 900.0, "random (--save-detailed)": 0.0}
# The plan those runs were made by (configs/local.yaml's bench: 20 prompts, 16 tokens, --ignore-eos, kimi-k3).
PLAN = Serving(prefix_caching=True, drafting=False, num_prompts=20, model="kimi-k3", output_len=16)


def judged_valid(text: str, workload: str) -> tuple[bool, str]:
    """(VALID?, why not) of one run's result as the bench stage judges it."""
    try:
        run = parse_result(text, workload.split()[0], 2)
    except UnreadableEvidence as err:
        return False, str(err)
    run = dataclasses.replace(run, prefix_cache={"queries": 1000.0, "hits": HITS[workload]})
    judged = cell([run], Validity(), PLAN, [])
    return judged.valid, "; ".join(judged.reasons)


@pytest.mark.parametrize("workload", sorted(REAL))
def test_the_real_results_are_valid_cells(workload):
    assert judged_valid(REAL[workload], workload) == (True, "")


def _ms_keys(data: dict[str, Any]) -> list[str]:
    return [k for k in data if k.endswith("_ms") and isinstance(data[k], float) and data[k] > 0]


def flip_sign(data: dict[str, Any], draw: Any) -> None:
    key = draw(st.sampled_from(_ms_keys(data)))
    data[key] = -data[key]


def zero(data: dict[str, Any], draw: Any) -> None:
    data[draw(st.sampled_from(["duration", "request_throughput", "output_throughput", "total_token_throughput"]))] = 0.0


def swap_percentiles(data: dict[str, Any], draw: Any) -> None:
    what = draw(st.sampled_from([w for w in LATENCIES if data[f"p99_{w}_ms"] > data[f"p50_{w}_ms"]]))
    data[f"p50_{what}_ms"], data[f"p99_{what}_ms"] = data[f"p99_{what}_ms"], data[f"p50_{what}_ms"]


def tail_below_median(data: dict[str, Any], draw: Any) -> None:
    what = draw(st.sampled_from([w for w in LATENCIES if data[f"median_{w}_ms"] > 0]))
    data[f"p99_{what}_ms"] = data[f"median_{what}_ms"] / draw(st.floats(2, 1000))


def past_the_run(data: dict[str, Any], draw: Any) -> None:
    what = draw(st.sampled_from(["mean_ttft_ms", "p99_e2el_ms", "mean_e2el_ms", "p99_ttft_ms"]))
    data[what] = draw(st.sampled_from([data["duration"] * 1000 * 1.5, 1e308]))


def fewer_prompts_than_planned(data: dict[str, Any], draw: Any) -> None:
    """A client that sent fewer (or more, or none) of the planned prompts, every count and rate consistent."""
    n = draw(st.integers(0, 40).filter(lambda k: k != 20))
    per = data["total_output_tokens"] // data["completed"]
    data.update(num_prompts=n, completed=n, failed=0, total_output_tokens=n * per,
                total_input_tokens=data["total_input_tokens"] * n // data["completed"])  # fmt: skip
    data["latencies"] = (data["latencies"] * 3)[:n]
    if n:
        recounted(data)
    else:
        for key in ("request_throughput", "output_throughput", "total_token_throughput"):
            data[key] = 0.0


def shortened_outputs(data: dict[str, Any], draw: Any) -> None:
    """Answers cut short (a max_tokens cap, a truncating server), the totals and rates made to agree."""
    data["total_output_tokens"] -= draw(st.integers(1, data["total_output_tokens"]))
    recounted(data)


def one_request_cut_short(data: dict[str, Any], draw: Any) -> None:
    """With --save-detailed: some requests' answers cut short, their lengths, the totals and rates made to agree
    (without the lists: the total alone falls short)."""
    cut = draw(st.integers(1, 15))
    if "output_lens" in data:
        for i in draw(st.sets(st.integers(0, len(data["output_lens"]) - 1), min_size=1)):
            data["output_lens"][i] -= cut
        data["total_output_tokens"] = sum(data["output_lens"])
    else:
        data["total_output_tokens"] -= cut
    recounted(data)


def other_concurrency(data: dict[str, Any], draw: Any) -> None:
    data["max_concurrency"] = draw(st.integers(1, 64).filter(lambda k: k != 2))


def other_model(data: dict[str, Any], draw: Any) -> None:
    data["model_id"] = draw(st.sampled_from(["kimi-k2", "", "Kimi-K3", "kimi-k3-draft"]))


DAMAGES: list[Callable[[dict[str, Any], Any], None]] = [
    flip_sign, zero, swap_percentiles, tail_below_median, past_the_run, fewer_prompts_than_planned,
    shortened_outputs, one_request_cut_short, other_concurrency, other_model,
]  # fmt: skip


@settings(max_examples=200)
@given(st.sampled_from(sorted(REAL)), st.sampled_from(DAMAGES), st.data())
def test_no_damaged_result_is_ever_a_valid_cell(workload, damage, data):
    document = json.loads(REAL[workload])
    damage(document, data.draw)
    valid, why = judged_valid(json.dumps(document), workload)
    assert not valid and why, (damage.__name__, document)


@given(st.sampled_from(sorted(REAL)), st.sampled_from(["completed", "duration", "mean_ttft_ms", "num_prompts"]))
def test_a_key_given_twice_is_refused_whichever_value_is_right(workload, key):
    text = REAL[workload]
    value = json.loads(text)[key]
    twice = text.rstrip().removesuffix("}") + f', "{key}": {json.dumps(value)}}}'  # even the same value
    valid, why = judged_valid(twice, workload)
    assert not valid and f"gives {key!r} twice" in why
