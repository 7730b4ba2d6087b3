"""The conformance stage's units of work: the served tokenizer read from node 0, the suite built and sent.

The suite is sent twice: one request at a time (alone), then all of it with `concurrency` requests in flight, the
streamed ones first so that many streams are open at once (under load) — the parser failures seen in the field
appear only then. Every request has its own timeout: a dead rank's share of requests never answers.
"""

from __future__ import annotations

import shlex
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import NodeError, TransportError
from k3deploy.core.stage import FailureClass
from k3deploy.tasks.chat_api import CHAT, Call, send
from k3deploy.tasks.conformance import cases as c
from k3deploy.tasks.conformance.answers import streamed, whole
from k3deploy.tasks.conformance.corpus import corpus
from k3deploy.tasks.conformance.prompt_tokens import PromptCounter, PromptCountError
from k3deploy.tasks.conformance.score import ALONE, LOAD, Result
from k3deploy.tasks.endpoints import service_url
from k3deploy.tasks.transport.factory import open_transports

PROGRESS_EVERY = 50  # requests between progress lines


Expected = dict[str, tuple[int, str]] | str  # usage case id → (prompt tokens, who counted them), or why none


@task(name="read the served tokenizer", cache_policy=NO_CACHE)
def served_counter(cfg: DeploymentConfig) -> PromptCounter | str:
    """The prompt counter from the tokenizer node 0 serves (`--tokenizer`, models.tokenizer_path), or why k3deploy
    has none (no tokenizers JSON, as Kimi-K3's tiktoken tokenizer): then the server's /tokenize counts."""
    node, folder = cfg.cluster.nodes[0].name, str(cfg.models.tokenizer_path or cfg.models.target.path)
    files = {}
    with open_transports(cfg.cluster) as transports:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            path = f"{folder}/{name}"
            try:
                result = transports[node].run(f"cat {shlex.quote(path)}", timeout=60)
            except TransportError as err:
                raise NodeError(node, f"cannot read {path}: {err}") from None
            if result.exit_code != 0:
                return f"k3deploy cannot read {path} on {node} ({result.stderr.strip()[:120] or 'no such file'})"
            files[name] = result.stdout
    try:
        return PromptCounter.from_files(files["tokenizer.json"], files["tokenizer_config.json"])
    except PromptCountError as err:
        return f"k3deploy cannot count prompts with {folder} on {node}: {err}"


def expected_counts(url: str, bodies: dict[str, dict], counter: PromptCounter | str, timeout: float) -> Expected:
    """Each usage prompt's token count: k3deploy's own; where it has none, the server's /tokenize (the served
    tokenizer and chat template, counted apart from the completion's usage); neither: why, for the usage rule."""
    if isinstance(counter, PromptCounter):
        try:
            return {case_id: (counter.count(body), c.K3DEPLOY_COUNT) for case_id, body in bodies.items()}
        except PromptCountError as err:
            return str(err)
    source = f"the server's /tokenize gives (k3deploy's own count: {counter})"
    counts = {}
    for case_id, body in bodies.items():
        asked = {k: body[k] for k in ("model", "messages", "tools", "chat_template_kwargs") if k in body}
        try:
            reply = httpx.post(f"{url}/tokenize", json=asked | {"add_generation_prompt": True}, timeout=timeout)
            count = reply.json().get("count") if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as err:
            return f"{counter}; the server's /tokenize: {type(err).__name__}: {err}"
        if not isinstance(count, int):
            return f"{counter}; the server's /tokenize answered HTTP {reply.status_code}: {reply.text[:120]}"
        counts[case_id] = (count, source)
    return counts


def build(cfg: DeploymentConfig, expected: Expected) -> list[c.Case]:
    """Every case of the suite, each streamed case after its whole twin (parameters are sent whole only)."""
    conf, model = cfg.conformance, cfg.serve.served_model_name
    tokens = conf.max_tokens
    schemas = corpus(conf.schemas)
    cases = [c.forced(s, model, tokens, conf.strict_tools) for s in schemas]
    cases += [c.auto(name, tools, model, tokens) for name, tools in c.AUTO_TOOLSETS.items()]
    cases += c.choice_cases(schemas, model, tokens)
    cases += c.reasoning_cases(model, tokens)
    for case_id, body in c.usage_bodies(model, tokens).items():
        cases.append(_usage(case_id, body, expected))
    paired = [variant for case in cases for variant in (case, case.streamed())]
    return paired + c.params_cases(model, tokens)


def _usage(case_id: str, body: dict, expected: Expected) -> c.Case:
    if isinstance(expected, str):
        why = expected
        return c.Case(case_id, "usage", body, lambda _a: c.Verdict(False, "uncounted", why, FailureClass.TOOL))
    count, source = expected[case_id]
    return c.usage_case(case_id, body, count, source)


def ask(http: httpx.Client, case: c.Case, load: str, timeout: float, request_id: str) -> Result:
    """Send one case and judge its answer."""
    started = time.monotonic()
    reply = send(http, Call("POST", CHAT, case.body, stream=case.stream, request_id=request_id), timeout)
    answer = streamed(reply) if case.stream else whole(reply)
    verdict = case.judge(answer)
    return Result(
        case.id, case.family, case.mode, load, verdict.ok, verdict.status, verdict.detail,
        verdict.cause.value if verdict.cause else None, verdict.keyword, round(time.monotonic() - started, 3),
        Call("POST", CHAT, case.body).excerpt(), answer.excerpt(),
        answer.same() if case.family != "params" and not answer.problem else {}, request_id,
    )  # fmt: skip


def send_suite(
    base_url: str,
    cases: list[c.Case],
    concurrency: int | None,
    timeout: float,
    progress: Callable[[str], None],
    stop: threading.Event | None = None,
) -> list[Result]:
    """The suite alone, then (when `concurrency`) under load; nothing more is sent once `stop` is set."""
    limits = httpx.Limits(max_connections=(concurrency or 1) + 4, max_keepalive_connections=(concurrency or 1) + 4)
    results: list[Result] = []
    total = len(cases) * (2 if concurrency else 1)
    suite = uuid.uuid4().hex[:8]  # this sending's requests, apart from any other's in the engine's log

    def request_id(load: str, index: int) -> str:
        return f"k3deploy-conformance-{suite}-{load}-{index}"

    def note(result: Result) -> None:
        results.append(result)
        if len(results) % PROGRESS_EVERY == 0 or len(results) == total:
            failed = sum(not r.ok for r in results)
            progress(f"{len(results)}/{total} requests judged, {failed} failed (last: {result.where()})")

    with httpx.Client(base_url=base_url, limits=limits) as http:
        for index, case in enumerate(cases):
            if stop is not None and stop.is_set():
                return results
            note(ask(http, case, ALONE, timeout, request_id(ALONE, index)))
        if concurrency:
            ordered = sorted(enumerate(cases), key=lambda pair: not pair[1].stream)  # the streams first

            def one(pair: tuple[int, c.Case]) -> Result | None:
                index, case = pair
                return None if stop is not None and stop.is_set() else ask(http, case, LOAD, timeout,
                                                                            request_id(LOAD, index))  # fmt: skip

            with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="k3deploy-conformance") as pool:
                for result in pool.map(one, ordered):
                    if result is not None:
                        note(result)
    return results


@task(name="conformance suite", cache_policy=NO_CACHE)  # asked of the live service, never cached
def conformance_suite(cfg: DeploymentConfig, counter: PromptCounter | str, stop: threading.Event | None = None
                      ) -> list[Result]:  # fmt: skip
    logger = get_run_logger()
    conf = cfg.conformance
    url = asked(cfg)
    bodies = c.usage_bodies(cfg.serve.served_model_name, conf.max_tokens)
    cases = build(cfg, expected_counts(url, bodies, counter, conf.request_timeout_s))
    concurrency = conf.in_flight(cfg.bench.max_concurrency) if conf.under_load else None
    logger.info("conformance: %d cases%s against %s", len(cases),
                f", then again at {concurrency} in flight" if concurrency else "", url)  # fmt: skip
    return send_suite(url, cases, concurrency, conf.request_timeout_s, logger.info, stop)


def asked(cfg: DeploymentConfig) -> str:
    """Where the suite is sent: conformance.url (a gateway in front of the service), else node 0's service."""
    return str(cfg.conformance.url).rstrip("/") if cfg.conformance.url else service_url(cfg)
