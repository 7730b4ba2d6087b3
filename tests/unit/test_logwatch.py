"""Launch log watching: every fatal line of log_patterns.json, a healthy A3 start-up, the pre-filter, the buffer."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import pytest

from k3deploy.errors import ConfigError
from k3deploy.tasks.launch.logwatch import (
    DEFAULT_PATTERNS,
    MAX_EVENT_LINE,
    LogBuffer,
    LogWatcher,
    compile_patterns,
    load_patterns,
    required_literals,
    strip_ansi,
)

pytestmark = pytest.mark.launch
PATTERNS = load_patterns()
DATA = json.loads(DEFAULT_PATTERNS.read_text())
MILESTONES = ["plugin_activated", "weights_loaded", "kv_cache", "graph_captured", "startup_complete"]

# Node 0 of a DP4/TP16 Kimi-K3 start-up, cut to its telling lines: WARNINGs, a handled traceback,
# "[Errno" in a warning, error-ish words in the config dump, a second TP worker loading weights.
HEALTHY_NODE0 = """\
INFO 06-23 13:44:05 [__init__.py:39] Available plugins for group vllm.platform_plugins:
INFO 06-23 13:44:05 [__init__.py:41] - ascend -> vllm_ascend:register
INFO 06-23 13:44:05 [__init__.py:44] All plugins in this group will be loaded. Set `VLLM_PLUGINS` to control which plugins to load.
INFO 06-23 13:44:05 [__init__.py:235] Platform plugin ascend is activated
WARNING 06-23 13:44:08 [_custom_ops.py:22] Failed to import from vllm._C with ModuleNotFoundError("No module named 'vllm._C'")
(APIServer pid=1) INFO 06-23 13:44:10 [api_server.py:1896] vLLM API server version 0.11.0rc3
(APIServer pid=1) INFO 06-23 13:44:10 [utils.py:233] non-default args: {'model_tag': '/models/Kimi-K3-w4a8', 'port': 8000, 'quantization': 'ascend', 'max_model_len': 32768, 'data_parallel_size': 4, 'tensor_parallel_size': 16, 'enable_expert_parallel': True, 'enable_prefix_caching': True, 'disable_log_stats': False, 'max_num_seqs': 16}
(APIServer pid=1) WARNING 06-23 13:44:11 [utils.py:1203] Unable to read NUMA balancing setting: [Errno 13] Permission denied: '/proc/sys/kernel/numa_balancing'
(APIServer pid=1) INFO 06-23 13:44:12 [model.py:547] Resolved architecture: KimiK3ForCausalLM
(APIServer pid=1) INFO 06-23 13:44:12 [model.py:1510] Using max model len 32768
(APIServer pid=1) INFO 06-23 13:44:12 [scheduler.py:205] Chunked prefill is enabled with max_num_batched_tokens=8192.
(APIServer pid=1) WARNING 06-23 13:44:13 [platform.py:310] If prefix caching is enabled, block size must be set to 128; overriding block_size to 128.
(EngineCore_DP0 pid=2876) INFO 06-23 13:44:20 [core.py:77] Initializing a V1 LLM engine (v0.11.0rc3) with config: model='/models/Kimi-K3-w4a8', quantization=ascend, enforce_eager=False, device_config=npu, enable_prefix_caching=True, chunked_prefill_enabled=True, disable_log_stats=False, errors_to_stderr=False, compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"}
(EngineCore_DP0 pid=2876) INFO 06-23 13:44:22 [core.py:412] Waiting for init message from front-end.
(EngineCore_DP0 pid=2876) INFO 06-23 13:44:23 [parallel_state.py:1208] rank 0 in world size 64 is assigned as DP rank 0, PP rank 0, TP rank 0, EP rank 0
(Worker_TP0 pid=3311) WARNING 06-23 13:44:31 [registry.py:502] Optional kernel package unavailable; using the torch implementation:
Traceback (most recent call last):
  File "/usr/local/python3.11.13/lib/python3.11/site-packages/vllm_ascend/ops/fused_moe.py", line 41, in <module>
    import mindie_turbo
ModuleNotFoundError: No module named 'mindie_turbo'
(Worker_TP0 pid=3311) INFO 06-23 13:44:35 [model_runner_v1.py:2605] Starting to load model /models/Kimi-K3-w4a8...
Loading safetensors checkpoint shards:  50% Completed | 32/64 [05:10<05:10,  9.70s/it]
(Worker_TP0 pid=3311) INFO 06-23 13:55:02 [default_loader.py:267] Loading weights took 626.84 seconds
(Worker_TP1 pid=3312) INFO 06-23 13:55:03 [default_loader.py:267] Loading weights took 627.10 seconds
(Worker_TP0 pid=3311) INFO 06-23 13:55:04 [model_runner_v1.py:2640] Loading model weights took 35.2134 GB
(Worker_TP0 pid=3311) INFO 06-23 13:55:40 [worker_v1.py:271] Available KV cache memory: 14.36 GiB
(EngineCore_DP0 pid=2876) INFO 06-23 13:55:41 [kv_cache_utils.py:1087] GPU KV cache size: 412,672 tokens
(EngineCore_DP0 pid=2876) INFO 06-23 13:55:41 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens per request: 12.59x
(Worker_TP0 pid=3311) INFO 06-23 13:56:23 [model_runner_v1.py:3302] Graph capturing finished in 38 secs, took 1.23 GiB
(EngineCore_DP0 pid=2876) INFO 06-23 13:56:25 [core.py:210] init engine (profile, create kv cache, warmup model) took 725.31 seconds
(APIServer pid=1) INFO 06-23 13:56:30 [api_server.py:1912] Starting vLLM API server 0 on http://0.0.0.0:8000
(APIServer pid=1) INFO:     Started server process [1]
(APIServer pid=1) INFO:     Waiting for application startup.
(APIServer pid=1) INFO:     Application startup complete.
(APIServer pid=1) INFO:     10.0.0.11:40312 - "GET /health HTTP/1.1" 200 OK
(APIServer pid=1) INFO 06-23 13:57:30 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
"""  # noqa: E501 - log lines are as long as vLLM writes them


def counter_clock(start: float = 100.0, step: float = 1.0):  # type: ignore[no-untyped-def]
    """A clock that advances `step` on every call, so event times are exact."""
    values = itertools.count(start, step)
    return lambda: next(values)


def write_patterns(tmp_path: Path, fatal: list[dict], milestones: list[dict] | None = None) -> Path:
    path = tmp_path / "patterns.json"
    path.write_text(json.dumps({"fatal": fatal, "milestones": milestones or []}))
    return path


EXAMPLES = [(e, x) for e in DATA["fatal"] for x in e["examples"]]


@pytest.mark.parametrize("entry", DATA["fatal"] + DATA["milestones"], ids=lambda e: e["id"])
def test_every_shipped_pattern_has_real_examples_with_their_sources(entry: dict):
    assert entry["examples"] and all(x["line"] and x["source"] for x in entry["examples"])


@pytest.mark.parametrize(("entry", "example"), EXAMPLES, ids=[f"{e['id']}-{i}" for i, (e, _) in enumerate(EXAMPLES)])
def test_every_fatal_example_is_sourced_and_matches_its_own_pattern_and_no_other(entry: dict, example: dict):
    assert example["source"].strip(), f"{entry['id']}: every example names where it was published or measured"
    hits = [p.id for p, _ in PATTERNS.match(example["line"]) if p.kind == "fatal"]
    assert hits == [entry["id"]]
    assert entry["why"] and "\n" not in entry["why"]


@pytest.mark.parametrize("entry", DATA["fatal"], ids=[e["id"] for e in DATA["fatal"]])
def test_each_fatal_example_fails_the_launch_through_the_watcher(entry: dict):
    line = entry["examples"][0]["line"]
    watcher = LogWatcher(PATTERNS, clock=counter_clock())
    events = watcher.feed("node2", 2, line + "\n")
    assert [(e.kind, e.id, e.node, e.rank) for e in events] == [("fatal", entry["id"], "node2", 2)]
    assert events[0].why == entry["why"] and line.strip().startswith(events[0].line.removesuffix("…"))
    assert watcher.first_fatal() == events[0]


def test_every_published_form_of_the_hccl_error_codes_is_covered():
    """EI0006 in three CANN generations' forms, EJ0003 and the newer EI0019, torch_npu's ERRxxxxx lines."""
    examples = {e["id"]: [x["line"] for x in e["examples"]] for e in DATA["fatal"]}
    assert any(line.startswith("[rank1]: EI0006: ") for line in examples["hccl_socket_timeout"])
    assert any("Get_Socket_Timeout(EI0006)" in line for line in examples["hccl_socket_timeout"])
    assert any("Communication_Error_Get_Socket(EI0006)" in line for line in examples["hccl_socket_timeout"])
    assert {c for line in examples["hccl_bind_failed"] for c in ("EJ0003", "EI0019") if c in line} == {
        "EJ0003",
        "EI0019",
    }
    assert {line.split(") ")[-1].split(" call")[0] for line in examples["acl_api_failed"]} == {
        "ERR00100 PTA", "ERR01100 OPS", "ERR02200 DIST"}  # fmt: skip
    # vLLM-Ascend removed this message in 2025; a current image never prints it, so nothing watches for it
    assert not LogWatcher(PATTERNS).feed("n", 0, "NotImplementedError: There is no available ascend quantizer.")


def test_captured_values_of_fatal_lines():
    by_id = {e["id"]: e["examples"][0]["line"] for e in DATA["fatal"]}
    watcher = LogWatcher(PATTERNS)
    assert watcher.feed("n", 0, by_id["unknown_quantization"])[0].value == "ascend"
    assert watcher.feed("n", 0, by_id["rpc_port_in_use"])[0].value == "tcp://127.0.0.1:28412"
    assert watcher.feed("n", 0, by_id["max_model_len_too_large"])[0].value == "65536"
    assert watcher.feed("n", 0, "zmq.error.ZMQError: Address already in use")[0].value is None


def test_healthy_startup_gives_no_fatal_and_the_five_milestones_in_order():
    watcher = LogWatcher(PATTERNS, clock=counter_clock())
    events = [e for line in HEALTHY_NODE0.splitlines() for e in watcher.feed("node0", 0, line)]
    assert len(HEALTHY_NODE0.splitlines()) >= 30
    assert [e.kind for e in events] == ["milestone"] * 5 and watcher.first_fatal() is None
    assert [e.id for e in events] == MILESTONES
    assert list(watcher.milestones()["node0"]) == MILESTONES
    values = {e.id: e.value for e in events}
    assert values == {
        "plugin_activated": "ascend",
        "weights_loaded": "626.84 seconds",  # the first TP worker's line, not TP1's or the GB line
        "kv_cache": "412,672",
        "graph_captured": "38",
        "startup_complete": None,
    }


def test_a_traceback_alone_is_not_fatal():
    watcher = LogWatcher(PATTERNS)
    lines = ["Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: boom"]
    assert [e for line in lines for e in watcher.feed("n", 0, line)] == []


def test_milestones_are_recorded_once_per_node_and_fatal_lines_every_time():
    watcher = LogWatcher(PATTERNS, clock=counter_clock(start=10.0))
    kv = "(EngineCore_DP1 pid=9) INFO 06-23 13:55:41 [kv_cache_utils.py:1087] GPU KV cache size: 1,024 tokens"
    assert len(watcher.feed("node0", 0, kv)) == 1
    assert watcher.feed("node0", 0, kv) == []
    assert [e.node for e in watcher.feed("node1", 1, kv)] == ["node1"]
    oom = "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB"
    first, second = watcher.feed("node1", 1, oom), watcher.feed("node3", 3, oom)
    assert len(first) == len(second) == 1 and watcher.fatal_count == 2
    assert watcher.first_fatal() == first[0] and [e.node for e in watcher.fatals()] == ["node1", "node3"]
    assert watcher.milestones() == {"node0": {"kv_cache": 10.0}, "node1": {"kv_cache": 12.0}}  # 11: the repeat
    assert watcher.milestone_rows(started_at=4.0) == [
        {"node": "node0", "rank": 0, "milestone": "kv_cache", "seconds": 6.0, "value": "1,024"},
        {"node": "node1", "rank": 1, "milestone": "kv_cache", "seconds": 8.0, "value": "1,024"},
    ]


def test_a_line_with_a_fatal_and_a_milestone_gives_both():
    line = "what(): HCCL watchdog thread terminated with exception: Watchdog caught collective operation timeout"
    ids = [e.id for e in LogWatcher(PATTERNS).feed("n", 0, line)]
    assert ids == ["collective_timeout", "hccl_watchdog_terminated"]


def test_ansi_colour_codes_are_stripped_before_matching():
    coloured = (
        "\x1b[32mINFO\x1b[0m 06-23 13:44:05 \x1b[2m[__init__.py:235]\x1b[0m "
        "Platform plugin \x1b[1mascend\x1b[0m is activated"
    )
    assert strip_ansi(coloured) == "INFO 06-23 13:44:05 [__init__.py:235] Platform plugin ascend is activated"
    watcher = LogWatcher(PATTERNS)
    (event,) = watcher.feed("node0", 0, coloured + "\r\n")
    assert (event.id, event.value) == ("plugin_activated", "ascend") and "\x1b" not in event.line
    (fatal,) = watcher.feed("node0", 0, "\x1b[31mERROR\x1b[0m NPU out\x1b[0m of memory")
    assert fatal.id == "npu_oom" and fatal.line == "ERROR NPU out of memory"


def test_event_lines_are_cut_to_500_characters():
    line = "RuntimeError: NPU out of memory. " + "x" * 2000
    (event,) = LogWatcher(PATTERNS).feed("n", 0, line)
    assert len(event.line) == MAX_EVENT_LINE and event.line.startswith("RuntimeError: NPU out of memory.")


def test_cpu_vllm_platform_line_is_the_plugin_milestone_too():
    (event,) = LogWatcher(PATTERNS).feed(
        "n", 0, "INFO 11-28 23:05:28 [__init__.py:225] Automatically detected platform cpu."
    )
    assert (event.id, event.value) == ("plugin_activated", "cpu")


def test_the_prefilter_gives_the_same_answer_as_searching_every_pattern():
    samples = HEALTHY_NODE0.splitlines() + [
        x["line"] for e in DATA["fatal"] + DATA["milestones"] for x in e["examples"]
    ]
    samples += [f"prefix {s} suffix" for s in samples] + ["", "x", "Loading", "GPU KV cache size: many tokens"]
    for line in samples:
        assert [p.id for p, _ in PATTERNS.match(line)] == [p.id for p, _ in PATTERNS.naive_match(line)], line
    assert PATTERNS.unanchored == ()


def test_required_literals():
    import re

    assert required_literals(re.compile(r"NPU out of memory")) == ["NPU out of memory"]
    assert required_literals(re.compile(r"(?:abc|Defg)h+")) == ["abc", "Defg"]
    assert required_literals(re.compile(r"\[Errno 98\].*[Aa]ddress already in use")) == ["Errno 98]"]
    assert required_literals(re.compile(r"(?:optional Text)?\d+")) is None
    assert required_literals(re.compile(r"(?i)npu out of memory")) is None
    assert required_literals(re.compile(r"(?:abc|)x")) == ["x"]  # a branch may be empty: only x is certain


def test_patterns_without_a_required_literal_are_still_found(tmp_path: Path):
    fatal = [
        {"id": "any_case", "pattern": "(?i)segmentation fault", "why": "a native crash"},
        {"id": "numbers", "pattern": r"^x=\d{3}$", "why": "only a two-character literal"},
        {"id": "anchored", "pattern": "Killed process (?P<pid>\\d+)", "capture": "pid", "why": "the OOM killer"},
    ]
    patterns = load_patterns(write_patterns(tmp_path, fatal))
    assert {p.id for p in patterns.unanchored} == {"any_case", "numbers"}
    watcher = LogWatcher(patterns)
    assert [e.id for e in watcher.feed("n", 0, "Fatal Python error: SEGMENTATION FAULT")] == ["any_case"]
    assert [e.id for e in watcher.feed("n", 0, "x=137")] == ["numbers"]
    assert [e.value for e in watcher.feed("n", 0, "Killed process 4242 (python3)")] == ["4242"]
    assert watcher.feed("n", 0, "all good") == []


def test_an_invalid_regex_names_the_entry(tmp_path: Path):
    fatal = [
        {"id": "fine", "pattern": "NPU out of memory", "why": "x"},
        {"id": "broken_one", "pattern": "Watchdog (caught", "why": "x"},
    ]
    with pytest.raises(ConfigError) as err:
        load_patterns(write_patterns(tmp_path, fatal))
    message = str(err.value)
    assert "fatal[1] (broken_one).pattern: invalid regex 'Watchdog (caught'" in message
    assert str(tmp_path / "patterns.json") in message and "fatal[0]" not in message


def test_every_problem_of_a_patterns_file_is_reported_at_once(tmp_path: Path):
    fatal = [
        {"id": "no_why", "pattern": "abc"},
        {"id": "no_group", "pattern": "abc", "why": "x", "capture": "n"},
        {"id": "bad_example", "pattern": "abc", "why": "x", "examples": [{"line": "xyz", "source": "here"}]},
        {"id": "typo", "pattern": "abc", "why": "x", "captrue": "n"},
        {"pattern": "abc", "why": "x"},
    ]
    milestones = [{"id": "no_why", "pattern": "def"}]
    with pytest.raises(ConfigError) as err:
        load_patterns(write_patterns(tmp_path, fatal, milestones))
    fields = [field for field, _ in err.value.problems]
    assert fields == [
        "fatal[0] (no_why).why",
        "fatal[1] (no_group).capture",
        "fatal[2] (bad_example).examples[0]",
        "fatal[3] (typo)",
        "fatal[4].id",
        "milestones[0] (no_why).id",
    ]
    with pytest.raises(ConfigError, match="lists 'fatal' and 'milestones'"):
        compile_patterns({"fatal": []})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the log patterns"):
        load_patterns(tmp_path / "bad.json")


def test_the_watcher_is_thread_safe():
    watcher = LogWatcher(PATTERNS)
    lines = [*HEALTHY_NODE0.splitlines(), "RuntimeError: NPU out of memory."]
    barrier = threading.Barrier(8)

    def stream(rank: int) -> None:
        barrier.wait()
        for _ in range(50):
            for line in lines:
                watcher.feed(f"node{rank % 4}", rank, line)

    threads = [threading.Thread(target=stream, args=(rank,)) for rank in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {node: list(seen) for node, seen in watcher.milestones().items()} == {
        f"node{i}": MILESTONES for i in range(4)
    }
    assert watcher.fatal_count == 8 * 50 and len(watcher.fatals()) == 100
    assert len(watcher.milestone_rows(0.0)) == 20


def test_log_buffer_keeps_the_tail_and_writes_every_line(tmp_path: Path):
    path = tmp_path / "logs" / "node0.log"
    with LogBuffer(max_lines=100, path=path) as buffer:
        for i in range(10_000):
            buffer.append(f"line {i}\n")
        assert buffer.tail(3) == ["line 9997", "line 9998", "line 9999"]
        assert len(buffer.tail()) == 100 and buffer.tail()[0] == "line 9900"
        assert buffer.lines_seen == 10_000
        buffer.flush()
        assert path.read_text().count("\n") == 10_000
    assert path.read_text().splitlines() == [f"line {i}" for i in range(10_000)]
    buffer.close()  # twice is fine
    buffer.append("after close")
    assert buffer.tail(1) == ["after close"] and path.read_text().splitlines()[-1] == "line 9999"


def test_log_buffer_memory_is_bounded_even_for_long_lines(tmp_path: Path):
    buffer = LogBuffer(max_lines=2, path=tmp_path / "n.log", max_line_chars=10)
    buffer.append("a" * 50)
    buffer.append("b\udcff")  # an undecodable byte from the container survives into the file
    buffer.close()
    assert buffer.tail() == ["a" * 10 + "…", "b\udcff"] and buffer.tail(0) == []
    assert (tmp_path / "n.log").read_text().splitlines() == ["a" * 50, "b\\udcff"]
    assert LogBuffer(max_lines=5).tail() == []
    with pytest.raises(ValueError):
        LogBuffer(max_lines=0)
