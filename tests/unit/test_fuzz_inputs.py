"""Bad input (issue 16): hypothesis feeds the config loader and every parser of what a node, a tool, the
server or a hub says random text and the real recorded outputs under tests/data, shuffled, cut short and with
characters flipped.

Garbage must come out as the parser's own failing result (a `fail` finding, None, an empty reading) or as one
of the project's errors (k3deploy.core.errors.K3DeployError and its subclasses, ConfigError for the config), which
the stages turn into a finding naming the node and the check. Anything else (a KeyError, an IndexError, a
TypeError, a bare ValueError out of int() or json) would escape a stage as a traceback instead of a verdict,
or worse, leave half a result behind. The plain tests at the end pin each bug the fuzzing found, with the
smallest input hypothesis shrank it to.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar
from unittest import mock

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from k3deploy.blocks import load_config, parse_config
from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.blocks.models import DraftSpec
from k3deploy.core.errors import ConfigError, HubError, K3DeployError, UnreadableEvidence
from k3deploy.core.stage import Finding as StageFinding
from k3deploy.tasks import metrics
from k3deploy.tasks import node_facts as nf
from k3deploy.tasks.accuracy.results import Evidence, Score, ais_scores, lm_eval_scores
from k3deploy.tasks.batch import SectionOutput, parse_output
from k3deploy.tasks.bench.results import BenchRun, acceptance, parse_result
from k3deploy.tasks.comm import host_checks as hc
from k3deploy.tasks.comm import npu_checks as nc
from k3deploy.tasks.comm.checks import PARSERS
from k3deploy.tasks.comm.runner import NodeFacts, cross_node, interpret_phase1, phase1_sections
from k3deploy.tasks.image.build import UnreadableCheckout, parse_checkout
from k3deploy.tasks.image.probe import name_findings, parse_pip_show, registry_names, serve_choices, version_findings
from k3deploy.tasks.launch import readiness
from k3deploy.tasks.models import remote
from k3deploy.tasks.models.checks import draft_findings, quantization_findings
from k3deploy.tasks.models.listing import Listing, RemoteFile, hf_file, list_modelscope, ms_head_commit
from k3deploy.tasks.preflight.evaluate import FactResult, NodeOutputs, evaluate, evaluate_engine
from k3deploy.tasks.preflight.facts import COMMAND_FACTS, Unreadable, parse_df, parse_engine
from k3deploy.tasks.runtime import ProcessState, parse_ps
from k3deploy.tasks.smoke.checks import CHECKS, Burst, Context, Outcome, Reply, stream_events
from k3deploy.tasks.transport import CommandResult
from k3deploy.tasks.watch.logwatch import LogEvent, LogWatcher, load_patterns
from k3deploy.tasks.watch.monitor import split_timestamp
from tests.configs import site_data

pytestmark = pytest.mark.faults

T = TypeVar("T")
ROOT = Path(__file__).parents[2]
DATA = ROOT / "tests" / "data"
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NODE = "node0"
PORTS = {"service_port": 8000, "rpc_port": 13345}
TOKEN = "recorded0001"  # the delimiter token of the recorded phase-1 batches


# -- what may come out ---------------------------------------------------------------------------------


def project_errors_only(call: Callable[[], T]) -> T | None:
    """The call's result, or None when it raised one of the project's errors; anything else fails the test."""
    try:
        return call()
    except K3DeployError as err:
        assert str(err).strip(), f"{type(err).__name__} without a message"
        return None


def config_or_config_error(call: Callable[[], Any]) -> None:
    """The loader gives a DeploymentConfig or a ConfigError listing its problems, nothing else."""
    try:
        cfg = call()
    except ConfigError as err:
        assert err.lines, "a ConfigError must list its problems"
        return
    assert isinstance(cfg, DeploymentConfig)


def assert_findings(rows: Any) -> None:
    assert rows is None or isinstance(rows, list), rows
    for row in rows or []:
        assert isinstance(row, StageFinding) and isinstance(row.ok, bool) and isinstance(row.detail, str), row


def assert_str_map(value: Any) -> None:
    """None (a project error was raised) or a dict of str to str."""
    assert value is None or isinstance(value, dict), value
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in (value or {}).items()), value


# -- what goes in --------------------------------------------------------------------------------------


def pool(*patterns: str) -> list[str]:
    """The recorded outputs under tests/data matching `patterns` (the recorders' scripts left out)."""
    files = sorted({p for pattern in patterns for p in DATA.glob(pattern) if p.is_file() and p.suffix != ".py"})
    assert files, patterns
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def _replies(path: Path) -> list[str]:
    steps = json.loads(path.read_text())["steps"]
    answers = [r for s in steps for r in ([s["reply"]] if "reply" in s else s["replies"])]
    return [r["text"] for r in answers if r["text"]]


COMM = pool("comm/**/*")
PREFLIGHT = pool("preflight/**/*")
BENCH = pool("bench/*")
ACCURACY = pool("accuracy/**/*")
LAUNCH = pool("launch/**/*")
METRICS = pool("bench/*metrics*", "smoke/**/metrics*.txt")
SMOKE = sorted({t for p in sorted(DATA.glob("smoke/vllm-*/*/*.json")) for t in _replies(p)})
PIP_SHOW = (
    "Name: vllm\nVersion: 0.32.0\nSummary: A high-throughput engine\nRequires: aiohttp\nRequired-by: vllm_ascend\n"
    "---\nName: vllm_ascend\nVersion: 0.11.0rc3\nLocation: /usr/lib/python3/site-packages\nRequires:\n"
)
SERVE_HELP = (
    "usage: vllm serve [model_tag] [options]\n\noptions:\n"
    "  --tokenizer-mode {auto,custom,hf,kimi_k3,mistral,slow}\n                        Tokenizer mode.\n"
    "  --reasoning-parser {deepseek_r1,glm45,kimi_k3,qwen3}\n                        Select the reasoning parser.\n"
    "  --tool-call-parser {deepseek_v3,hermes,kimi_k3}\n                        Select the tool call parser.\n"
    "  --enable-auto-tool-choice\n"
)
CHECKOUT = "source_revision=" + "0123abcd" * 5 + "\nvllm_commit=v0.32.0\n"

# Characters that trip parsers: digits int() refuses (²) or reads (١), line breaks splitlines() knows and
# split("\n") does not, NUL, table and JSON punctuation.
ODD = st.sampled_from(list("0123456789²³١٣.:-=|/\\ \t\r\n\x00\x0b\x0c\x1c\x1e\x85\u2028{}[]\",'#%e+x-_aZ"))


@st.composite
def mangled(draw: st.DrawFn, sources: Sequence[str]) -> str:
    """A recorded output shuffled, windowed, cut short, with characters flipped and random text spliced in."""
    lines = draw(st.sampled_from(sources)).splitlines()
    if lines and draw(st.booleans()):
        start = draw(st.integers(0, len(lines) - 1))
        lines = lines[start : draw(st.integers(start, len(lines)))]
    if draw(st.booleans()):
        draw(st.randoms(use_true_random=False)).shuffle(lines)
    text = "\n".join(lines)
    for _ in range(draw(st.integers(0, 6))):
        if not text:
            break
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + draw(st.one_of(ODD, st.characters())) + text[i + 1 :]
    if draw(st.booleans()):
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.text(ODD, max_size=12)) + text[i:]
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text


def texts(*pools: Sequence[str]) -> st.SearchStrategy[str]:
    sources = [t for p in pools for t in p]
    return st.one_of(st.text(max_size=200), st.text(ODD, max_size=200), mangled(sources))


RC = st.one_of(st.just(0), st.none(), st.integers(-256, 512))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 2**63, 10**400]),
    st.floats(),
    st.text(max_size=16),
    st.text(ODD, max_size=8),
)
JSONISH = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


def _slots(node: Any, out: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Every (container, key) below `node`, for a mutation to pick from."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in list(items):
        out.append((node, key))
        _slots(value, out)
    return out


@st.composite
def mutated(draw: st.DrawFn, documents: Sequence[Any], values: st.SearchStrategy[Any] = JSONISH) -> Any:
    """A real document with values replaced by random values of random types, keys deleted, unknown keys added."""
    data = copy.deepcopy(draw(st.sampled_from(documents)))
    for _ in range(draw(st.integers(1, 4))):
        slots = _slots(data, [])
        op = draw(st.sampled_from(("replace", "delete", "add")))
        if op == "add" or not slots:
            dicts = [d for d in [data, *(c[k] for c, k in slots)] if isinstance(d, dict)]
            if dicts:
                draw(st.sampled_from(dicts))[draw(st.text(max_size=12))] = draw(values)
            continue
        container, key = draw(st.sampled_from(slots))
        if op == "delete":
            del container[key]
        else:
            container[key] = draw(values)
    return data


# -- the config loader ---------------------------------------------------------------------------------

LOCAL = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
SECTIONS = ("cluster", "models", "image", "serve", "smoke", "conformance", "bench", "accuracy")
# Pieces of YAML that make the parser or its constructors work: tags, anchors, merges, bad dates and numbers.
YAML_PIECES = st.sampled_from(
    ["cluster:", "nodes:", "serve:", "- ", "  ", "\n", "{", "}", "[", "]", ", ", ": ", "? ", "---\n", "...\n",
     "%YAML 1.1\n", "!!timestamp ", "!!int ", "!!float ", "!!binary ", "!!set ", "!!omap ", "!!str ", "!!map ",
     "!!python/object:os.system ", "!foo ", "&a ", "*a", "<<: ", "<<: *a", "2001-02-30", "2001-13-40 25:61:61",
     "2002-12-14t21:59:43.10-05:00", "0x", "0o9", "0b2", "1e999", ".nan", "-.inf", "~", "null", "yes", "off", "'",
     '"', '"\\u', '"\\x', "|", ">", "#", "@", "`", "\t", "12:30:45", "1_000", "="]
)  # fmt: skip
YAMLISH = st.lists(st.one_of(YAML_PIECES, st.text(ODD, max_size=4)), max_size=30).map("".join)


def load_text(content: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deployment.yaml"
        # a drawn lone surrogate is written as the invalid bytes a damaged file would hold (plain UTF-8 refuses it)
        path.write_bytes(content if isinstance(content, bytes) else content.encode(errors="surrogatepass"))
        config_or_config_error(lambda: load_config(path, environ={}))


@SETTINGS
@given(st.one_of(st.text(max_size=300), YAMLISH))
def test_load_config_on_any_text(text: str) -> None:
    load_text(text)


@FEW
@given(st.binary(max_size=200))
def test_load_config_on_any_bytes(data: bytes) -> None:
    load_text(data)


@FEW
@given(st.one_of(JSONISH, st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=8), JSONISH, max_size=7)))
def test_load_config_on_any_yaml_document(document: Any) -> None:
    load_text(yaml.safe_dump(document))
    config_or_config_error(lambda: parse_config(document, "document", environ={}))


@SETTINGS
@given(mutated([LOCAL]))
def test_load_config_on_the_local_profile_mutated(document: Any) -> None:
    config_or_config_error(lambda: parse_config(copy.deepcopy(document), "local.yaml", environ={}))
    load_text(yaml.safe_dump(document))


@FEW
@given(mutated([LOCAL]).map(yaml.safe_dump), st.data())
def test_load_config_on_the_local_profile_as_text_mangled(text: str, data: st.DataObject) -> None:
    load_text(data.draw(mangled([text])))


# -- comm: npu-smi, hccn_tool, spod-info, pings --------------------------------------------------------


@SETTINGS
@given(texts(COMM), RC, st.integers(0, 20), st.integers(1, 3))
def test_parse_npu_smi_info(text: str, rc: int | None, npus: int, dies: int) -> None:
    assert_findings(project_errors_only(lambda: nc.parse_npu_smi_info(NODE, text, rc, npus, dies)))


@SETTINGS
@given(st.sampled_from(sorted(PARSERS)), texts(COMM), RC, st.integers(0, 15))
def test_hccn_tool_parsers(query: str, text: str, rc: int | None, npu: int) -> None:
    assert_findings(project_errors_only(lambda: PARSERS[query](NODE, npu, text, rc)))


@SETTINGS
@given(texts(COMM))
def test_hccn_and_spod_value_extractors(text: str) -> None:
    for extract in (nc.npu_ip, nc.vnic_ip, nc.tls_switch, nf.driver_version, nf.firmware_version):
        value = project_errors_only(lambda extract=extract: extract(text))
        assert value is None or isinstance(value, str)
    assert_str_map(project_errors_only(lambda: nc.spod_fields(text)))


@SETTINGS
@given(texts(COMM), RC, st.integers(0, 15), st.booleans())
def test_parse_spod_info_and_ping(text: str, rc: int | None, npu: int, hccs: bool) -> None:
    assert_findings(project_errors_only(lambda: nc.parse_spod_info(NODE, npu, text, rc)))

    def ping() -> list[StageFinding]:
        return nc.parse_ping(NODE, npu, text, rc, peer="node1", peer_npu=npu, address="10.0.0.1", hccs=hccs)

    assert_findings(project_errors_only(ping))


@SETTINGS
@given(
    texts(COMM),
    RC,
    st.integers(0, 16),
    st.dictionaries(st.integers(0, 16), st.none() | st.text(ODD, max_size=15), max_size=4),
)
def test_hccn_conf(text: str, rc: int | None, npus: int, npu_ips: dict[int, str | None]) -> None:
    assert_str_map(project_errors_only(lambda: hc.hccn_conf_values(text)))
    assert_findings(project_errors_only(lambda: hc.parse_hccn_conf(NODE, text, rc, npus, npu_ips)))


@SETTINGS
@given(texts(COMM), texts(COMM), st.text(max_size=15), st.text(ODD, max_size=15))
def test_nic_and_local_ip(links: str, addrs: str, nic: str, local_ip: str) -> None:
    assert_str_map(project_errors_only(lambda: hc.interfaces(links)))
    owned = project_errors_only(lambda: hc.addresses(addrs))
    assert owned is None or all(isinstance(v, list) for v in owned.values())
    assert_findings(project_errors_only(lambda: hc.parse_nic(NODE, nic, local_ip, links, addrs)))


@SETTINGS
@given(texts(COMM, PREFLIGHT), RC, st.sampled_from(["driver_version", "firmware_version"]))
def test_ports_and_versions(text: str, rc: int | None, check: str) -> None:
    ports = project_errors_only(lambda: nf.listening(text))
    assert ports is None or all(isinstance(k, int) and isinstance(v, str) for k, v in ports.items())
    assert_findings(project_errors_only(lambda: hc.parse_free_ports(NODE, text, rc, PORTS)))
    got = project_errors_only(lambda: hc.parse_version(NODE, check, text, rc))
    if got is not None:
        assert_findings(got[0])
        assert got[1] is None or isinstance(got[1], str)


SECTIONS_16 = phase1_sections(16, nc.ToolPaths(), PORTS)


@FEW
@given(texts(COMM))
def test_a_phase1_batch_end_to_end(output: str) -> None:
    """The batch split back into sections, then every parser on them, then the cross-node comparisons."""
    from k3deploy.blocks.cluster import NodeSpec

    outputs = project_errors_only(lambda: parse_output(SECTIONS_16, output, TOKEN))
    assert outputs is not None and all(isinstance(o, SectionOutput) for o in outputs.values())
    node = NodeSpec(name=NODE, address="10.213.0.10", nic="eth0")
    facts = project_errors_only(lambda: interpret_phase1(node, outputs, 16, PORTS))
    assert isinstance(facts, NodeFacts)
    assert_findings(facts.rows)
    assert_findings(project_errors_only(lambda: cross_node({NODE: facts})))


# -- preflight facts -----------------------------------------------------------------------------------

A3 = parse_config(site_data(), "kimi-k3-a3.yaml", environ={})
ENGINE = json.loads((DATA / "preflight" / "node0" / "engine_version.json").read_text())


@SETTINGS
@given(st.sampled_from(COMMAND_FACTS), texts(PREFLIGHT, COMM), RC)
def test_preflight_fact_parsers(fact: Any, text: str, rc: int | None) -> None:
    project_errors_only(lambda: fact.parse(text, rc))
    project_errors_only(lambda: parse_df(text))
    result = evaluate(fact, A3, 0, NODE, SectionOutput(fact.name, rc, text))
    assert isinstance(result, FactResult) and result.state in ("ok", "fail")


DF_HEADER = "Filesystem 1-blocks Used Available Capacity Mounted on\n"
DF_LINES = st.lists(st.text(ODD, min_size=1, max_size=6).filter(str.strip), min_size=6, max_size=6).map(" ".join)
ENGINE_SHAPED = st.fixed_dictionaries({"Version": st.just("4.3"), "ApiVersion": st.just("1.41"), "Components": JSONISH})


@SETTINGS
@given(DF_LINES)
def test_preflight_df_line(line: str) -> None:
    found = project_errors_only(lambda: parse_df(DF_HEADER + line))
    assert found is None or all(isinstance(found[k], int) for k in ("bytes_total", "bytes_available"))


@SETTINGS
@given(st.one_of(mutated([ENGINE]), ENGINE_SHAPED, st.dictionaries(st.text(max_size=12), JSONISH, max_size=4)))
def test_preflight_engine_answer(info: Any) -> None:
    value = project_errors_only(lambda: parse_engine(info))
    assert value is None or isinstance(value, dict)
    result = evaluate_engine(A3, 0, NodeOutputs(NODE, host_key="SHA256:x", engine=info))
    assert isinstance(result, FactResult) and result.state in ("ok", "fail")


# -- bench, /metrics, accuracy -------------------------------------------------------------------------

BENCH_JSON = [json.loads(t) for t in pool("bench/*.json")]


@SETTINGS
@given(st.one_of(texts(BENCH), mutated(BENCH_JSON).map(json.dumps)))
def test_bench_saved_result(text: str) -> None:
    run = project_errors_only(lambda: parse_result(text, "random", 2))
    if run is not None:
        assert isinstance(run, BenchRun) and isinstance(run.completed, int) and isinstance(run.failed, int)
        assert all(isinstance(v, float) for v in run.figures.values())


@SETTINGS
@given(texts(METRICS), texts(METRICS))
def test_metrics_and_acceptance(before: str, after: str) -> None:
    samples = project_errors_only(lambda: metrics.parse(after))
    assert samples is not None and all(isinstance(s, metrics.Sample) for s in samples)
    assert all(isinstance(s.value, float) and isinstance(s.labels, dict) for s in samples)
    spec = project_errors_only(lambda: acceptance(before, after))
    assert spec is None or isinstance(spec, dict)


LM_DIR = DATA / "accuracy" / "lm_eval-0.4.13"
LM_RESULTS = json.loads((LM_DIR / "results_k3_arith.json").read_text())
LM_ROWS = [json.loads(line) for line in (LM_DIR / "samples_k3_arith.jsonl").read_text().splitlines() if line]
AIS_ROWS = [json.loads(t) for t in pool("accuracy/ais_bench-*/**/predictions_*.jsonl")[0].splitlines() if t]
JSONL = st.lists(mutated(LM_ROWS + AIS_ROWS), max_size=4).map(lambda rows: "\n".join(map(json.dumps, rows)))


@SETTINGS
@given(
    st.one_of(texts(ACCURACY), mutated([LM_RESULTS]).map(json.dumps)),
    st.one_of(texts(ACCURACY), JSONL),
    st.none() | st.sampled_from(["exact_match,first-number", "name"]) | st.text(max_size=8),
)
def test_lm_eval_scores(results: str, samples: str, metric: str | None) -> None:
    def score() -> list[Score]:
        return lm_eval_scores(Evidence("r.json", results), {"k3_arith": Evidence("s.jsonl", samples)}, ["k3_arith"],
                              {}, metric, "sha256:x")  # fmt: skip

    scores = project_errors_only(score)
    assert scores is None or all(isinstance(s, Score) and isinstance(s.score, float) for s in scores)


@SETTINGS
@given(texts(ACCURACY), st.one_of(texts(ACCURACY), JSONL), st.one_of(texts(ACCURACY), JSONL))
def test_ais_bench_scores(summary: str, predictions: str, failures: str) -> None:
    def score() -> list[Score]:
        return ais_scores(Evidence("s.csv", summary), {"k3_arith": Evidence("p.jsonl", predictions)},
                          {"k3_arith": Evidence("f.jsonl", failures)}, {"k3_arith": 10}, "3.1", "x")  # fmt: skip

    scores = project_errors_only(score)
    assert scores is None or all(isinstance(s, Score) and isinstance(s.score, float) for s in scores)


# -- launch: the log watcher, log timestamps, the process runtime's ps ---------------------------------

WATCHER = LogWatcher(load_patterns(), clock=lambda: 0.0)
PS_LINE = st.tuples(
    st.text(ODD, max_size=8), st.sampled_from(["alive", "dead", "x"]), st.sampled_from(["-", "0", "1", "x"]),
    st.one_of(JSONISH.map(json.dumps), st.text(ODD, max_size=12)),
).map("\t".join)  # fmt: skip


@SETTINGS
@given(texts(LAUNCH), st.integers(0, 3))
def test_log_watcher_feed(text: str, rank: int) -> None:
    for line in text.splitlines() or [text]:
        events = project_errors_only(lambda line=line: WATCHER.feed(NODE, rank, line))
        assert events is not None and all(isinstance(e, LogEvent) for e in events)
        stamp, rest = split_timestamp(line)
        assert (stamp is None or isinstance(stamp, float)) and isinstance(rest, str)


@SETTINGS
@given(st.one_of(texts(LAUNCH), st.lists(PS_LINE, max_size=4).map("\n".join)))
def test_parse_ps(text: str) -> None:
    states = project_errors_only(lambda: parse_ps(text))
    assert states is not None
    for state in states:
        assert isinstance(state, ProcessState) and isinstance(state.labels, dict), state


MODELS = {"object": "list", "data": [{"id": "kimi-k3", "object": "model", "max_model_len": 2048}]}
CHAT = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ready"}, "finish_reason": "length"}]}


@SETTINGS
@given(st.one_of(mutated([MODELS]), JSONISH), st.one_of(mutated([CHAT]), JSONISH))
def test_readiness_probe_on_any_answer(models: Any, chat: Any) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, text=json.dumps(models if request.url.path == "/v1/models" else chat))

    real = httpx.Client

    def client(**kwargs: Any) -> httpx.Client:
        return real(transport=httpx.MockTransport(answer), **kwargs)

    with mock.patch.object(httpx, "Client", client):
        found = project_errors_only(lambda: readiness.probe("http://node0.invalid:8000", "kimi-k3", 1.0))
    assert isinstance(found, readiness.Probe) and found.reached in ("down", "health", "models", "chat"), found


# -- image: pip show, vllm serve --help, the build checkout --------------------------------------------


@SETTINGS
@given(texts([PIP_SHOW, SERVE_HELP, CHECKOUT]), st.none() | st.lists(st.text(max_size=8), max_size=4))
def test_image_probe_parsers(text: str, registered: list[str] | None) -> None:
    versions = project_errors_only(lambda: parse_pip_show(text))
    assert versions is not None
    assert_str_map(versions)
    assert all(isinstance(f, StageFinding) for f in version_findings(versions))
    choices = project_errors_only(lambda: serve_choices(text, registered))
    assert (choices is not None and registry_names(text) is None) or isinstance(registry_names(text), list)
    wanted = {"--tokenizer-mode": "kimi_k3", "--tool-call-parser": "kimi_k3", "--reasoning-parser": "kimi_k3"}
    found = project_errors_only(lambda: name_findings(choices or {}, wanted, []))
    assert found is not None and all(isinstance(f, StageFinding) and isinstance(f.ok, bool) for f in found)
    checkout = project_errors_only(lambda: parse_checkout(text))
    assert checkout is None or (isinstance(checkout, tuple) and all(isinstance(v, str) for v in checkout))


# -- models: hub listings, the node agent's result and progress, checkpoint documents -------------------

MS_ITEM = {
    "Name": "config.json", "Path": "config.json", "Type": "blob", "Size": 1234, "Sha256": "ab" * 32,
    "Id": "c0ffee", "Revision": "0123abcd" * 5, "CommittedDate": 1764547200,
}  # fmt: skip
MS_PAYLOAD = {"Code": 200, "Data": {"Files": [MS_ITEM, MS_ITEM | {"Path": "model.safetensors", "Size": 10}]}}


@SETTINGS
@given(st.one_of(mutated([MS_PAYLOAD]), JSONISH))
def test_modelscope_listing(payload: Any) -> None:
    request = httpx.Request("GET", "http://hub.invalid/api")
    response = httpx.Response(200, text=json.dumps(payload), request=request)  # json.dumps: NaN passes, as from a hub
    with mock.patch("httpx.get", return_value=response):
        listing = project_errors_only(lambda: list_modelscope("org/m", None, "http://hub.invalid", None))
    if listing is not None:
        assert isinstance(listing, Listing) and isinstance(listing.commit, str) and listing.commit
        assert all(isinstance(f, RemoteFile) and isinstance(f.size, int) for f in listing.files)
        assert all(isinstance(f.path, str) for f in listing.files)
    inner = payload.get("Data") if isinstance(payload, dict) else None
    items = inner.get("Files") if isinstance(inner, dict) else None
    if isinstance(items, list) and all(isinstance(i, dict) for i in items):  # what list_modelscope passes it
        commit = project_errors_only(lambda: ms_head_commit(items))
        assert commit is None or isinstance(commit, str)


@SETTINGS
@given(SCALARS, st.one_of(st.none(), JSONISH), st.text(max_size=8) | st.none())
def test_huggingface_tree_entry(size: Any, lfs: Any, blob: str | None) -> None:
    entry = SimpleNamespace(path="model.safetensors", size=size, blob_id=blob, lfs=lfs)
    found = project_errors_only(lambda: hf_file(entry))
    assert found is None or (isinstance(found, RemoteFile) and isinstance(found.size, int))


AGENT_RESULT = {
    "fingerprint": "f" * 64, "missing_bytes": 0, "free_bytes": 10**12, "device": 2049,
    "checks": [{"path": "config.json", "ok": True, "problem": ""}], "hashed": ["config.json"],
    "manifest": {"repo": "org/m", "commit": "c" * 40, "verify_seconds": 1.5, "format": 1, "total_bytes": 12,
                 "files": {"config.json": {"size": 12, "mtime_ns": 1, "sha256": "a" * 64, "git_blob": None,
                                           "verified_at": "2026-12-01T00:00:00+00:00"}}},
    "documents": {"config.json": "{}"}, "previous_commit": None,
}  # fmt: skip


@SETTINGS
@given(st.one_of(mutated([AGENT_RESULT]).map(json.dumps), texts(COMM)), st.text(max_size=40), st.integers(-1, 2))
def test_node_agent_result(stdout: str, stderr: str, code: int) -> None:
    result = CommandResult(NODE, "python3 -c ...", code, "progress\n" + stdout, stderr, 0.1)
    report = project_errors_only(lambda: remote.parse_result(NODE, result))
    if report is not None:
        assert isinstance(report, remote.NodeReport)
        assert all(isinstance(getattr(report, k), int) for k in ("missing_bytes", "free_bytes", "device"))


PROGRESS = {"op": "fetch", "done": 10, "total": 20, "file": "config.json"}


@SETTINGS
@given(st.one_of(mutated([PROGRESS]).map(json.dumps), JSONISH.map(json.dumps)))
def test_node_agent_progress(body: str) -> None:
    line = "K3PROGRESS " + body
    data = project_errors_only(lambda: remote.parse_progress(line))
    assert data is None or isinstance(data, dict)
    seen: list[tuple[float, str]] = []
    board = remote.ProgressBoard(lambda fraction, text: seen.append((fraction, text)), every_s=0)
    project_errors_only(lambda: board.on_output(NODE, "stderr", line))
    assert all(isinstance(fraction, float) for fraction, _ in seen)


TARGET = Listing("org/m", "c" * 40, (RemoteFile("config.json", 1, "a" * 64, None),))
CONFIG = {"vocab_size": 163840, "hidden_size": 7168, "kv_lora_rank": 512, "text_config": {"vocab_size": 163840}}


@SETTINGS
@given(
    st.one_of(texts(ACCURACY), JSONISH.map(json.dumps)),
    mutated([CONFIG]),
    mutated([CONFIG]),
    st.sampled_from(["gqa", "mla", "mla-block5", None]),
)
def test_checkpoint_documents(description: str, target_config: Any, draft_config: Any, kind: str | None) -> None:
    found = project_errors_only(lambda: quantization_findings("target", TARGET, description))
    assert found is not None and all(isinstance(f, StageFinding) for f in found)
    spec = DraftSpec(repo="org/draft", kind=kind, num_speculative_tokens=7)
    if isinstance(target_config, dict) and isinstance(draft_config, dict):
        rows = project_errors_only(lambda: draft_findings(TARGET, TARGET, target_config, draft_config, spec))
        assert rows is not None and all(isinstance(f, StageFinding) for f in rows)


# -- smoke: the server's answers -----------------------------------------------------------------------

CONTEXT = Context(model="kimi-k3", vision=True, prefix_caching=True, engines={"0": "node0", "1": "node1"}, burst=2)
SMOKE_JSON = [d for d in (Reply(200, t).json() for t in SMOKE) if isinstance(d, dict)]
CHUNK = {"choices": [{"delta": {"content": "Hi"}, "index": 0}]}


def maybe(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An object with all or some of these fields, each holding its strategy's value."""
    return st.fixed_dictionaries(fields) | st.fixed_dictionaries({}, optional=fields)


# An OpenAI-shaped answer whose every field may hold a value of the wrong type.
ARGUMENTS = st.one_of(st.just('{"city": "Paris"}'), JSONISH.map(json.dumps), JSONISH)
FUNCTION = maybe(name=st.sampled_from(["get_weather", "get_time"]) | JSONISH, arguments=ARGUMENTS)
TOOL_CALL = maybe(id=JSONISH, function=FUNCTION | JSONISH)
TOOL_CALLS = st.one_of(st.lists(TOOL_CALL | JSONISH, min_size=1, max_size=2), JSONISH)
MESSAGE = maybe(content=JSONISH, reasoning=JSONISH, reasoning_content=JSONISH, tool_calls=TOOL_CALLS)
CHOICE = maybe(message=MESSAGE | JSONISH, delta=MESSAGE | JSONISH, finish_reason=JSONISH)
ANSWER = maybe(choices=st.one_of(st.lists(CHOICE | JSONISH, min_size=1, max_size=2), JSONISH)).map(json.dumps)
SSE_DATA = st.one_of(mutated([CHUNK]).map(json.dumps), ANSWER, JSONISH.map(json.dumps), st.just("[DONE]"))
SSE = st.lists(SSE_DATA.map(lambda body: f"data: {body}"), max_size=4).map("\n\n".join)
REPLY_TEXT = st.one_of(ANSWER, SSE, mutated(SMOKE_JSON).map(json.dumps), texts(SMOKE, METRICS))
REPLY = st.builds(Reply, st.sampled_from([200, 200, 200, 200, 500, 0]), REPLY_TEXT, st.text(max_size=8))


@SETTINGS
@given(st.one_of(SSE, texts(SMOKE)))
def test_stream_events(text: str) -> None:
    events, done = stream_events(text)
    assert all(isinstance(e, dict) for e in events) and isinstance(done, bool)


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
@SETTINGS
@given(data=st.data())
def test_smoke_checks_on_any_answer(check: Any, data: st.DataObject) -> None:
    steps = check.run(CONTEXT)
    outcome: Any = None
    try:
        step = next(steps)
        for _ in range(20):
            answer: Any = [data.draw(REPLY) for _ in step.calls] if isinstance(step, Burst) else data.draw(REPLY)
            step = steps.send(answer)
        pytest.fail(f"{check.name} asked more than 20 requests")
    except StopIteration as done:
        outcome = done.value
    except K3DeployError:
        return
    assert isinstance(outcome, Outcome) and outcome.ok in (True, False, None) and isinstance(outcome.detail, str)


# -- the bugs the fuzzing found ------------------------------------------------------------------------


# -- the bugs the fuzzing found, each with the smallest input hypothesis shrank it to ----------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("2001-02-30", "day is out of range for month"),  # was ValueError from PyYAML's timestamp constructor
        ("!!int ", "cannot be read as its type"),  # was IndexError
        ("!!timestamp foo", "cannot be read as its type"),  # was AttributeError
        (b"\x80", "not UTF-8 text: byte 0x80 at offset 0"),  # was UnicodeDecodeError
        ("a: &x [*x]", "contains itself"),  # was RecursionError: an alias inside its own anchor
        ("[" * 5000, "nested too deeply"),  # was RecursionError from PyYAML's composer
        ("0: ", "a key must be a name (text), not 0"),  # was TypeError: keywords must be strings (Prefect's Block)
        ("cluster: {1: 2}", "cluster: a key must be a name (text), not 1"),
    ],
)
def test_load_config_reports_what_yaml_cannot_be(content: str | bytes, problem: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deployment.yaml"
        # a drawn lone surrogate is written as the invalid bytes a damaged file would hold (plain UTF-8 refuses it)
        path.write_bytes(content if isinstance(content, bytes) else content.encode(errors="surrogatepass"))
        with pytest.raises(ConfigError, match=re.escape(problem)):
            load_config(path, environ={})


def test_npu_smi_chip_beyond_the_board_fails_its_row() -> None:
    # was ValueError from topology.logical_id: a chip row numbered past the dies of a board
    text = "| NPU Name | Health |\n| 0 Ascend910 | OK |\n| 2 0 | 0000:9D:00.0 |\n"
    rows = nc.parse_npu_smi_info(NODE, text, 0, 2)
    assert [(r.npu, r.ok) for r in rows] == [(None, False), (0, False), (1, False)]
    assert "chip 2 beyond 2 per board" in rows[0].detail


def test_preflight_reads_only_ascii_digits_and_tolerates_any_engine_components() -> None:
    # was ValueError from int("²") ("²".isdigit()), which evaluate() does not catch: only Unreadable
    with pytest.raises(Unreadable, match="df line not understood"):
        parse_df(DF_HEADER + "0 ² 0 0 0 0")
    assert issubclass(Unreadable, K3DeployError) and issubclass(Unreadable, ValueError)
    # was TypeError: 'int' object is not iterable
    engine = parse_engine({"Version": "4.3", "ApiVersion": "1.41", "Components": 1})
    assert engine["name"] == "Engine" and engine["components"] == []


def test_bench_result_with_a_figure_beyond_any_float() -> None:
    # was OverflowError: int too large to convert to float
    with pytest.raises(UnreadableEvidence, match="duration is out of range"):
        parse_result(json.dumps({"num_prompts": 1, "completed": 1, "duration": 10**400}), "random", 2, ["duration"])
    with pytest.raises(UnreadableEvidence, match="not JSON"):  # a project error now, still a ValueError for callers
        parse_result("", "random", 2)


@pytest.mark.parametrize(
    ("results", "samples", "metric", "problem"),
    [
        # was AttributeError: 'NoneType' object has no attribute 'items'
        ('{"results": null}', "", None, "no 'results' object"),
        # was TypeError: 'NoneType' object is not iterable
        ('{"results": {"k3_arith": null}}', "", None, "r.json: results.k3_arith is 'None', not an object"),
        # was ValueError: could not convert string to float: 'k3_arith'
        (
            '{"results": {"k3_arith": {"name": "k3_arith"}}}',
            "",
            "name",
            "results.k3_arith's name is 'k3_arith', not a number",
        ),
        # was TypeError from int()
        (
            '{"results": {"k3_arith": {"a,b": 1}}, "n-samples": {"k3_arith": {"effective": []}}}',
            "",
            None,
            "not a count",
        ),
        # was json.JSONDecodeError, naming neither the file nor the line
        ('{"results": {"k3_arith": {"a,b": 0.5}}}', "{", None, "s.jsonl: line 1 is not JSON"),
    ],
)
def test_lm_eval_results_that_are_not_lm_evals(results: str, samples: str, metric: str | None, problem: str) -> None:
    with pytest.raises(UnreadableEvidence, match=re.escape(problem)):
        lm_eval_scores(Evidence("r.json", results), {"k3_arith": Evidence("s.jsonl", samples)}, ["k3_arith"], {},
                       metric, "sha256:x")  # fmt: skip


def test_lm_eval_n_samples_of_another_shape_is_no_count_unless_the_dataset_gives_one() -> None:
    # was AttributeError: 'int' object has no attribute 'get'
    results = Evidence("r.json", '{"results": {"k3_arith": {"a,b": 0.5}}, "n-samples": {"k3_arith": 1}}')
    samples = {"k3_arith": Evidence("s.jsonl", '{"doc_id": 0, "resps": [["4"]], "filtered_resps": ["4"]}')}
    with pytest.raises(UnreadableEvidence, match=re.escape("n-samples.k3_arith.effective is 'None', not a count")):
        lm_eval_scores(results, samples, ["k3_arith"], {}, None, "sha256:x")
    [score] = lm_eval_scores(results, samples, ["k3_arith"], {"k3_arith": 3}, None, "sha256:x")
    assert (score.score, score.completed, score.missing, score.dataset_size) == (0.5, 1, 2, 3)


@pytest.mark.parametrize(
    ("summary", "problem"),
    [
        ("dataset,version,metric,mode,m\nk3_arith", "has 1 columns, not 5"),  # was IndexError
        ("a\rb", "not CSV"),  # was csv.Error: new-line character seen in unquoted field
        ("", "not the expected table"),  # a bare ValueError before
    ],
)
def test_ais_bench_summary_that_is_not_a_table(summary: str, problem: str) -> None:
    with pytest.raises(UnreadableEvidence, match=re.escape(problem)):
        ais_scores(Evidence("s.csv", summary), {}, {}, {}, "3.1", "x")


def test_process_labels_that_are_not_an_object() -> None:
    # was ProcessState(labels=None): `found.labels.get(...)` then raised AttributeError
    assert parse_ps("\talive\t-\tnull") == [ProcessState("", True, None, {})]


def test_build_checkout_without_a_commit_is_a_project_error() -> None:
    # was a bare ValueError, which the image build task does not catch
    with pytest.raises(UnreadableCheckout, match="no commit"):
        parse_checkout("")
    assert issubclass(UnreadableCheckout, K3DeployError)


@pytest.mark.parametrize(
    ("models", "chat", "reached"),
    [
        (None, None, "health"),  # was AttributeError: 'NoneType' object has no attribute 'get'
        ({"data": None}, None, "health"),  # was TypeError: 'NoneType' object is not iterable
        ({"data": [{"id": "kimi-k3"}]}, {"choices": [None]}, "models"),  # was AttributeError
    ],
)
def test_readiness_probe_on_answers_of_the_wrong_shape(models: Any, chat: Any, reached: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=json.dumps(models if request.url.path == "/v1/models" else chat))

    real = httpx.Client
    with mock.patch.object(httpx, "Client", lambda **kwargs: real(transport=httpx.MockTransport(answer), **kwargs)):
        assert readiness.probe("http://node0.invalid:8000", "kimi-k3", 1.0).reached == reached


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        (None, "not a list of files"),  # was TypeError: 'NoneType' object is not iterable
        ([None], "not a list of files"),  # was AttributeError
        ([{"Path": "a"}], "without a path and a byte size: path 'a', size None"),  # was KeyError/TypeError
        ([{"Path": "a", "Size": ""}], "size ''"),  # was ValueError from int()
        ([MS_ITEM | {"CommittedDate": "x"}], "CommittedDate is not a time"),  # was ValueError from int()
        ([MS_ITEM | {"Revision": ""}], "names no commit"),  # a bare ValueError from ms_head_commit before
    ],
)
def test_modelscope_listing_of_the_wrong_shape(files: Any, problem: str) -> None:
    request = httpx.Request("GET", "http://hub.invalid/api")
    response = httpx.Response(200, json={"Data": {"Files": files}}, request=request)
    with mock.patch("httpx.get", return_value=response), pytest.raises(HubError, match=re.escape(problem)):
        list_modelscope("org/m", None, "http://hub.invalid", None)


def test_huggingface_tree_entry_without_a_size() -> None:
    # was TypeError: int() argument must be ... not 'NoneType'
    with pytest.raises(HubError, match="without a path and a byte size"):
        hf_file(SimpleNamespace(path="model.safetensors", size=None, blob_id="", lfs=None))


@pytest.mark.parametrize(
    ("stdout", "problem"),
    [
        ("{}", "lacks 'fingerprint'"),  # was KeyError
        (json.dumps(AGENT_RESULT | {"device": None}), "not readable"),  # was TypeError from int()
        (json.dumps(AGENT_RESULT | {"checks": [{"": 1}]}), "not readable"),  # was TypeError from FileCheck(**c)
        (json.dumps(AGENT_RESULT | {"manifest": {"files": {}}}), "not readable"),  # was TypeError from Manifest
    ],
)
def test_node_agent_result_of_the_wrong_shape(stdout: str, problem: str) -> None:
    result = CommandResult(NODE, "python3 -c ...", 0, stdout, "", 0.1)
    with pytest.raises(remote.NodeAgentError, match=re.escape(problem)):
        remote.parse_result(NODE, result)


@pytest.mark.parametrize(
    "body", ["{}", '{"done": "", "total": 1}', '{"done": 1, "total": null}', f'{{"done": {10**400}, "total": 1}}']
)
def test_progress_lines_that_are_not_the_agents_are_ignored(body: str) -> None:
    # were KeyError, ValueError, TypeError from int(), and OverflowError in the summary
    seen: list[tuple[float, str]] = []
    board = remote.ProgressBoard(lambda fraction, text: seen.append((fraction, text)), every_s=0)
    board.on_output(NODE, "stderr", "K3PROGRESS " + body)
    assert seen == [] and board.nodes == {}


def test_stream_events_are_objects_only() -> None:
    # was [None]: check_streaming then raised AttributeError on it
    assert stream_events("data: null\n\ndata: [DONE]") == ([], True)


@pytest.mark.parametrize(
    ("check", "text", "detail"),
    [
        ("chat", '{"choices": {"0": 1}}', "no choice with a message"),  # was KeyError: 0
        ("chat", '{"choices": [{"message": {"content": true}}]}', "no generated text"),  # was AttributeError
        ("image + text", '{"choices": [{"message": {"content": 1}}]}', "no text about the image"),  # was TypeError
        ("streaming", 'data: {"choices": 1}', "no closing [DONE]"),  # was TypeError: 'int' object is not iterable
        ("streaming", 'data: {"choices": [{"delta": 1}]}', "no closing [DONE]"),  # was AttributeError
        ("tool call", '{"choices": [{"message": {"tool_calls": 1}}]}', "no tool_calls entry"),  # was TypeError
        ("tool call", '{"choices": [{"message": {"tool_calls": [1]}}]}', "never declared"),  # was AttributeError
        ("tool call", '{"choices": [{"message": {"tool_calls": [{"function": {"name": []}}]}}]}', "never declared"),
        (
            "tool call",
            '{"choices": [{"message": {"tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}]}}]}',
            "arguments are not JSON",  # was TypeError: the JSON object must be str, not dict
        ),
        ("reasoning", '{"choices": [{"message": {"reasoning": "r", "content": 1}}]}', "no answer"),  # was TypeError
    ],
)
def test_smoke_checks_fail_answers_of_the_wrong_shape(check: str, text: str, detail: str) -> None:
    steps = next(c for c in CHECKS if c.name == check).run(CONTEXT)
    next(steps)
    with pytest.raises(StopIteration) as done:
        steps.send(Reply(200, text))
    outcome = done.value.value
    assert outcome.ok is False and detail in outcome.detail, outcome
