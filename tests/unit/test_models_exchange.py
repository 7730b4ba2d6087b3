"""The striped download's plan (pure): one hub copy of each missing file, the rest from peers, who serves whom."""

from __future__ import annotations

import json

import pytest

from k3deploy.tasks.models.exchange import exchange_part, plan_lines, stop_command, stripe_plan
from k3deploy.tasks.models.listing import Listing, RemoteFile
from k3deploy.tasks.models.remote import job

pytestmark = pytest.mark.models

SIZES = {"a.safetensors": 400, "b.safetensors": 300, "c.safetensors": 200, "d.safetensors": 100, "config.json": 5}
LISTING = Listing("org/m", "c" * 40, tuple(RemoteFile(p, n, "a" * 64, None) for p, n in SIZES.items()))
NODES = ("node0", "node1", "node2", "node3")


def test_every_missing_file_comes_from_the_hub_once_in_stripes_of_about_equal_bytes():
    plan = stripe_plan(LISTING, dict.fromkeys(NODES, tuple(SIZES)))
    downloads = [p for part in plan.values() for p in part.download]
    assert sorted(downloads) == sorted(SIZES)  # each file through the uplink once
    hub_bytes = {n: sum(SIZES[p] for p in part.download) for n, part in plan.items()}
    assert hub_bytes == {"node0": 400, "node1": 300, "node2": 200, "node3": 105}  # largest first, least loaded
    for node, part in plan.items():  # everything else from the node that downloads it, or any that got it since
        assert set(part.download) | set(part.from_peers or {}) == set(SIZES)
        for path, sources in (part.from_peers or {}).items():
            assert path in plan[sources[0]].download and set(sources) == set(NODES) - {node}
            receivers = set(NODES) - {sources[0]}
            assert set((part.rescue or {})[path]) == receivers  # who fetches it from the hub if no peer can
        assert part.serve == () and set(part.serve_to) == set(NODES) - {node}
    # each file's rescue order starts at another receiver, so rescues spread over the nodes
    firsts = {(plan["node0"].rescue or {}).get(p, ("node0",))[0] for p in SIZES if p not in plan["node0"].download}
    assert len(firsts) > 1


def test_a_node_that_holds_a_file_serves_it_and_no_one_downloads_it_from_the_hub():
    both = ["a.safetensors", "d.safetensors"]
    wanted = {"node0": ["d.safetensors"], "node1": both, "node2": both}
    plan = stripe_plan(LISTING, wanted)
    assert [(n, p) for n, part in plan.items() for p in part.download] == [("node0", "d.safetensors")]  # no holder
    # node0 holds a (and downloads d); node1 and node2 lack both: each is the other's second source, once it has it
    assert plan["node1"].from_peers == {"a.safetensors": ("node0", "node2"), "d.safetensors": ("node0", "node2")}
    assert plan["node2"].from_peers == {"a.safetensors": ("node0", "node1"), "d.safetensors": ("node0", "node1")}
    assert plan["node1"].rescue == plan["node2"].rescue == {"a.safetensors": ("node1", "node2"),
                                                            "d.safetensors": ("node2", "node1")}  # fmt: skip
    assert plan["node0"].serve == tuple(p for p in SIZES if p != "d.safetensors")
    # every node serves until every node that fetches is done (node0 too: the hub may fail it)
    assert plan["node0"].serve_to == ("node1", "node2") and plan["node1"].serve_to == ("node0", "node2")
    assert plan["node2"].serve == tuple(p for p in SIZES if p not in both)
    assert plan["node0"].fetches and plan["node2"].fetches
    assert not stripe_plan(LISTING, {"node0": [], "node1": ["a.safetensors"]})["node0"].fetches


def test_several_holders_are_tried_in_node_order_and_held_files_come_before_those_still_downloading():
    wanted = {"node0": [], "node1": [], "node2": list(SIZES), "node3": ["a.safetensors", "b.safetensors"]}
    plan = stripe_plan(LISTING, wanted)
    held_by_three = {p: ("node0", "node1", "node3") for p in SIZES if p not in ("a.safetensors", "b.safetensors")}
    assert (
        plan["node2"].from_peers
        == {
            "a.safetensors": ("node0", "node1", "node3"),  # its holders, then the other node that lacks it
            "b.safetensors": ("node0", "node1", "node3"),
        }
        | held_by_three
    )
    assert plan["node3"].download == () and plan["node3"].from_peers == {
        "a.safetensors": ("node0", "node1", "node2"),
        "b.safetensors": ("node0", "node1", "node2"),
    }
    fresh = stripe_plan(LISTING, {"node0": ["a.safetensors", "d.safetensors"], "node1": list(SIZES)})
    # node1 first fetches what node0 holds already, then node0's downloads in the order node0 makes them.
    assert list(fresh["node1"].from_peers or {}) == ["b.safetensors", "c.safetensors", "config.json", "a.safetensors"]
    assert fresh["node0"].download == ("a.safetensors",) and fresh["node1"].download == ("d.safetensors",)


def test_the_exchange_part_listens_on_the_node_address_and_names_its_peers_by_their_own():
    plan = stripe_plan(LISTING, dict.fromkeys(NODES[:2], tuple(SIZES)))
    addresses = {"node0": "10.0.0.1", "node1": "fd00::2"}
    part = exchange_part("node0", plan["node0"], addresses, 18090, "tok")
    assert part["listen"] == ["10.0.0.1", 18090]
    assert part["peers"] == {"node1": "http://[fd00::2]:18090"}
    assert part["token"] == "tok" and part["download"] == list(plan["node0"].download)
    body = json.loads(job("exchange", "/srv/m", LISTING, urls=dict.fromkeys(SIZES, "http://hub/x"), exchange=part))
    assert sorted(body["fetch"]) == sorted(SIZES)  # its stripe and what it takes from peers
    assert body["exchange"]["token"] == "tok"  # on stdin, in the job; never in the command


def test_the_exchange_op_and_its_part_go_together():
    with pytest.raises(ValueError, match="exchange op"):
        job("exchange", "/srv/m", LISTING)
    with pytest.raises(ValueError, match="exchange op"):
        job("fetch", "/srv/m", LISTING, exchange={"download": [], "from_peers": {}})


def test_the_stop_command_quotes_the_root_and_kills_only_the_agent():
    command = stop_command("/srv/models/it's here/")
    assert "'/srv/models/it'\"'\"'s here/.k3deploy-exchange.pid'" in command
    assert command.count("'/srv/models/it'\"'\"'s here/.k3deploy-exchange.pid'") == 2  # read, then removed
    assert 'grep -q k3deploy_node_agent "/proc/$p/cmdline"' in command  # a reused pid is not killed


def test_plan_lines_say_what_each_node_takes_from_where():
    plan = stripe_plan(LISTING, dict.fromkeys(NODES[:2], tuple(SIZES)))
    lines = plan_lines(LISTING, plan)
    assert lines[0].startswith("node0 ") and "from the hub" in lines[0] and "from peers" in lines[0]
    assert len(lines) == 2


def test_progress_says_per_node_what_came_from_the_hub_and_what_from_peers():
    from k3deploy.tasks.models.remote import ProgressBoard

    seen: list[tuple[float, str]] = []
    board = ProgressBoard(lambda fraction, text: seen.append((fraction, text)), every_s=0)
    line = 'K3PROGRESS {"op": "fetch", "done": %d, "total": 1000000000, "sources": %s}'
    board.on_output("node0", "stderr", line % (250_000_000, '{"hub": 250000000}'))
    board.on_output("node1", "stderr", line % (1_000_000_000, '{"hub": 250000000, "peer node0": 750000000}'))
    fraction, text = seen[-1]
    assert fraction == 0.625
    assert "node0 25%, node1 100% (hub 0.25 GB, peers 0.75 GB)" in text  # node0 took nothing from peers yet
    board.on_output("node2", "stderr", line % (5, '{"hub": "5"}'))  # not a byte count: not shown as one
    assert "node2 0%" in seen[-1][1] and "node2 0% (" not in seen[-1][1]


def test_the_exchange_token_travels_on_stdin_only():
    from k3deploy.tasks.models.remote import agent_command, agent_input
    from k3deploy.tasks.transport.base import with_timeout

    plan = stripe_plan(LISTING, dict.fromkeys(NODES[:2], tuple(SIZES)))
    part = exchange_part("node0", plan["node0"], {"node0": "10.0.0.1", "node1": "10.0.0.2"}, 18090, "xtok-123")
    body = job("exchange", "/m", LISTING, urls=dict.fromkeys(SIZES, "http://hub/x"), exchange=part)
    assert b"xtok-123" in agent_input(body)  # the agent needs it ...
    assert "xtok-123" not in with_timeout(agent_command("python3"), 60)  # ... but it is never in a command line
