"""How a receiver of the striped download judges and picks its sources (pure parts of node_exchange)."""

from __future__ import annotations

import pytest

from k3deploy.tasks.node import node_agent as agent
from k3deploy.tasks.node.node_exchange import (
    FANOUT,
    JUDGE_AFTER_S,
    Board,
    Rates,
    StreamWatch,
    alternative,
    choose,
    too_slow,
)

pytestmark = pytest.mark.models
MB = 1e6


def test_a_stream_is_too_slow_only_under_the_fraction_of_a_measured_alternative_and_after_its_start():
    hub = ("the hub", 40 * MB)
    assert too_slow(1 * MB, JUDGE_AFTER_S, hub, 0.5) == "sent 1.00 MB/s, under 0.5 × the 40.0 MB/s of the hub"
    assert too_slow(1 * MB, JUDGE_AFTER_S - 0.1, hub, 0.5) is None  # TCP's start is not judged
    assert too_slow(20 * MB, 10, hub, 0.5) is None  # exactly half: kept
    assert too_slow(1 * MB, 10, None, 0.5) is None  # nothing to compare with
    assert too_slow(1 * MB, 10, hub, 0) is None  # judging off


def test_the_alternative_is_the_hub_or_the_median_of_the_other_peers_not_found_slow_whichever_is_higher():
    rates = Rates()
    assert alternative(rates, "peer node0", set()) is None
    rates.observe("hub", 30 * MB)
    assert alternative(rates, "peer node0", set()) == ("the hub", 30 * MB)
    for peer, rate in (("node1", 100), ("node2", 80), ("node3", 5)):
        rates.observe(f"peer {peer}", rate * MB)
    assert alternative(rates, "peer node0", set()) == ("the other peers", 80 * MB)  # median of 5, 80, 100
    assert alternative(rates, "peer node1", {"node2"}) == ("the hub", 30 * MB)  # node2 slow, node1 itself out
    rates.observe("peer node0", 0.5 * MB)
    assert alternative(rates, "peer node1", set()) == ("the hub", 30 * MB)  # peers 0.5, 5, 80: median 5 < the hub


def test_a_rate_is_the_median_of_recent_streams():
    rates = Rates()
    for r in (1, 50, 2):
        rates.observe("hub", r * MB)
    assert rates.typical("hub") == 2 * MB and rates.typical("peer node9") is None


def test_the_watch_raises_once_its_judge_says_so_and_a_short_stream_still_tells_its_rate(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("k3deploy.tasks.node.node_exchange.time.monotonic", lambda: clock[0])
    rates = Rates()
    said: list[tuple[float, float]] = []

    def judge(rate: float, elapsed: float) -> str | None:
        said.append((rate, elapsed))
        return "too slow" if elapsed >= 3 else None

    watch = StreamWatch("peer node0", rates, judge)
    watch(5_000_000)  # the first chunk starts the clock: its bytes crossed before it, untimed
    for second in (1, 2):
        clock[0] = 100.0 + second
        watch(1_000_000)
    assert said == [(1e6, 1.0), (1e6, 2.0)] and rates.typical("peer node0") == 1e6
    clock[0] = 103.0
    with pytest.raises(agent.SlowSource, match="too slow"):
        watch(1_000_000)
    short = StreamWatch("hub", rates)
    short(1)
    short(2 << 20)  # all within one window
    clock[0] = 103.5
    short.finish()
    assert rates.typical("hub") == (2 << 20) / 0.5


class _Seen(Board):
    """A board as read from the peers' /have answers (no network)."""

    def __init__(self, seen: dict[str, dict], gone: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.seen, self.gone = seen, set(gone)


def test_a_receiver_takes_a_file_from_a_holder_not_busy_with_it_preferring_one_that_is_not_its_first_holder():
    path = "model-00001.safetensors"
    board = _Seen({
        "node0": {"ready": [path], "sending": {path: 1}},
        "node1": {"ready": [path], "sending": {}},
        "node2": {"ready": [], "sending": {}},
    })  # fmt: skip
    sources = ["node0", "node1", "node2"]
    assert choose(sources, board, path, set()) == "node1"  # spreading: the copy node1 verified
    board.seen["node1"]["sending"] = {path: 1}
    assert choose(sources, board, path, set()) == "node1"  # as busy as node0: still not the first holder
    board.seen["node0"]["sending"] = {path: FANOUT}
    board.seen["node1"]["sending"] = {path: FANOUT}
    assert choose(sources, board, path, set()) is None  # both send it to FANOUT peers: wait
    board.seen["node0"]["sending"] = {}
    assert choose(sources, board, path, {"node0"}) is None  # node0 avoided (slow, or gone)
    assert choose(sources, _Seen(board.seen, gone={"node0"}), path, set()) is None
    assert board.found_slow() == set()
    board.seen["node2"]["slow"] = ["node0"]
    assert board.found_slow() == {"node0"}  # one node's finding is every receiver's
