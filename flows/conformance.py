"""The conformance stage: the served API keeps the Kimi-K3 contract, as the model vendor's verifier checks it before
any benchmark — forced and automatic tool calls valid against their schemas, streamed and not, alone and under load;
the same answer streamed and not; usage counted right; bad parameters refused; reasoning apart from the content.

The requests go on under a watch of every rank (tasks/watch/liveness.py): one lost fails the stage naming it.
"""

import json
from dataclasses import asdict

from prefect import flow, runtime

from k3deploy.blocks.source import ConfigSource, resolve_config
from k3deploy.core.errors import ConformanceStageFailed
from k3deploy.core.paths import run_folder
from k3deploy.core.stage import StageResult
from k3deploy.tasks.conformance.score import Limits, as_dicts, figures, score
from k3deploy.tasks.conformance.steps import asked, conformance_suite, served_counter
from k3deploy.tasks.stage_run import StageRun
from k3deploy.tasks.watch.liveness import watching

SHOWN_FAILURES = 50  # failed cases in the table artifact and the record; all of them are in conformance.json


@flow(name="conformance")
def conformance(config: ConfigSource) -> StageResult:
    """Each rule passes within its threshold, in each mode and load, or fails naming the cases that broke it."""
    cfg = resolve_config(config)
    run = StageRun("conformance", ConformanceStageFailed)
    if not cfg.conformance.enabled:
        return run.not_applicable("conformance.enabled is false")
    folder = run_folder(str(runtime.flow_run.root_flow_run_id or runtime.flow_run.id), "conformance")
    with run.guard(), watching(cfg, "conformance") as watch:
        counter = served_counter(cfg)
        results = watch.run(conformance_suite, cfg, counter, watch.stop)
    limits = Limits(**cfg.conformance.thresholds.model_dump(include=set(Limits.__dataclass_fields__)))
    rows = score(results, limits)
    run.findings = [row.finding() for row in rows]
    shown = figures(results, rows)
    failed = [r for r in as_dicts(results) if not r["ok"]]
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "conformance.json"
    report.write_text(json.dumps({"base_url": asked(cfg), "figures": shown, "rules": [asdict(r) for r in rows],
                                  "cases": as_dicts(results)}, indent=1) + "\n")  # fmt: skip
    run.table("rules", [asdict(r) for r in rows], f"conformance rules against {asked(cfg)}")
    run.table("failures", failed[:SHOWN_FAILURES], "failed cases: request, answer, status and why")
    run.data = {"report": str(report), "figures": shown, "rules": [asdict(r) for r in rows],
                "failures": failed[:SHOWN_FAILURES]}  # fmt: skip
    run.note(f"every request and answer: `{report}`")
    if shown["only_under_load"]:
        run.note(f"failed only under load: {', '.join(shown['only_under_load'][:10])}")
    return run.passed(headline(shown))


def headline(shown: dict) -> str:
    """'254 requests; schema accuracy 42.5 % in every mode and load; usage 16/16 exact; parameters 26/26 as due'."""
    rates = shown["schema_accuracy"]
    if len(set(rates.values())) == 1:
        accuracy = f"{next(iter(rates.values())):.1%} in every mode and load"
    else:
        accuracy = ", ".join(f"{k} {v:.1%}" for k, v in rates.items()) or "n/a"
    usage, params = shown["usage_checks"], shown["parameter_checks"]
    return (
        f"{shown['requests']} requests; schema accuracy {accuracy}; usage {usage['exact']}/{usage['checked']} "
        f"exact; parameters {params['as_due']}/{params['checked']} as due"
    )
