"""Bisecting a regression or a failure: what differs between two runs, what an experiment runs, what it shows.

Pure functions over run records, as history's are. The suspects are what can be varied between the last
pass and the bad run (config keys; the image, its digest or serving environment; a checkpoint's revision;
the draft); an experiment is the bad run's config with some of them put back to the good end's values.
The search is delta debugging (Zeller's ddmin) over the suspects, after re-running both ends: it asks for
the experiment it needs next, given the ones done, so a bisect resumes from any prefix of them.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import ConfigError, K3DeployError
from k3deploy.core.stage import FailureClass, StageResult, Verdict
from k3deploy.records.history import FAMILY_KEYS, IGNORED_KEYS, figures, flatten
from k3deploy.records.record import RunRecord
from k3deploy.tasks.stage_cache import CachedStage, inputs_digest

ABSENT = "(none)"  # a key one end's config does not have


class SuspectKind(StrEnum):
    CONFIG = "config"
    IMAGE = "image"
    CHECKPOINT = "checkpoint"
    DRAFT = "draft"


class Suspect(BaseModel):
    """One difference an experiment can put back: a name, and its config keys at each end."""

    name: str
    kind: SuspectKind
    good: dict[str, Any] = Field(description="dotted config key → the good end's value (absent: not there)")
    bad: dict[str, Any] = Field(description="dotted config key → the bad end's value")

    def describe(self) -> str:
        return "; ".join(
            f"{key}: {_show(self.good.get(key, ABSENT))} → {_show(self.bad.get(key, ABSENT))}"
            for key in sorted(self.good.keys() | self.bad.keys())
        )


def _show(value: Any) -> str:
    return value if value == ABSENT else json.dumps(value, default=str)


def _group(key: str) -> tuple[str, SuspectKind]:
    if key.startswith("image."):
        return "image", SuspectKind.IMAGE
    if key.startswith("models.draft"):
        return "draft", SuspectKind.DRAFT
    if key.startswith("models.target.") or key == "models.tokenizer_path":
        return "target checkpoint", SuspectKind.CHECKPOINT
    return key, SuspectKind.CONFIG


def suspects(good: RunRecord, bad: RunRecord) -> tuple[list[Suspect], list[str]]:
    """What can be varied between the two runs, and what differs but cannot be (named as such)."""
    old, new = flatten(good.config), flatten(bad.config)
    groups: dict[str, Suspect] = {}

    def add(key: str, before: Any, after: Any) -> None:
        name, kind = _group(key)
        suspect = groups.setdefault(name, Suspect(name=name, kind=kind, good={}, bad={}))
        if before != ABSENT:
            suspect.good[key] = before
        if after != ABSENT:
            suspect.bad[key] = after

    for key in sorted(old.keys() | new.keys()):
        if key.startswith(IGNORED_KEYS) or key in FAMILY_KEYS:
            continue
        if old.get(key, ABSENT) != new.get(key, ABSENT):
            add(key, old.get(key, ABSENT), new.get(key, ABSENT))
    fixed: list[str] = []
    moved_digest = good.image and bad.image and good.image.digest != bad.image.digest
    if moved_digest and "image" not in groups:  # the same config, the tag moved: pin each end's digest
        if good.image.digest and bad.image.digest:  # type: ignore[union-attr]
            add("image.digest", good.image.digest, bad.image.digest)  # type: ignore[union-attr]
        else:
            fixed.append(f"image: {good.image.image_id} → {bad.image.image_id} under the same config, no digest to pin")  # type: ignore[union-attr]
    commits = {c.role: c.commit for c in good.checkpoints}
    for c in bad.checkpoints:
        name = "target checkpoint" if c.role == "target" else "draft"
        if commits.get(c.role, c.commit) != c.commit and name not in groups:
            add(f"models.{c.role}.revision", commits[c.role], c.commit)  # the same branch moved: pin each commit
    fixed += _facts_changed(good, bad)
    return sorted(groups.values(), key=lambda s: s.name), fixed


def _facts_changed(good: RunRecord, bad: RunRecord) -> list[str]:
    """Node facts (driver, firmware, kernel …) and host keys: they come with the nodes, no run can vary them.
    Facts that are a node's state at the time (free space, ports: tables, not versions) are left out."""
    out = []
    for node in sorted(good.node_facts.keys() | bad.node_facts.keys()):
        before, after = good.node_facts.get(node, {}), bad.node_facts.get(node, {})
        for fact in sorted(before.keys() | after.keys()):
            state = isinstance(before.get(fact), dict | list) or isinstance(after.get(fact), dict | list)
            if not state and before.get(fact) != after.get(fact):
                out.append(f"node {node} {fact}: {before.get(fact, ABSENT)} → {after.get(fact, ABSENT)}")
    for node in sorted(good.host_keys.keys() & bad.host_keys.keys()):
        if good.host_keys[node] != bad.host_keys[node]:
            out.append(f"node {node} host key: {good.host_keys[node]} → {bad.host_keys[node]}")
    if good.image and bad.image and good.image.versions != bad.image.versions:
        out += [f"{name} version (inside the image): {good.image.versions.get(name, ABSENT)} → "
                f"{bad.image.versions.get(name, ABSENT)}"
                for name in sorted(good.image.versions.keys() | bad.image.versions.keys())
                if good.image.versions.get(name) != bad.image.versions.get(name)]  # fmt: skip
    return out


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(data.get(part), dict):
            data[part] = {}
        data = data[part]
    if value == ABSENT:
        data.pop(parts[-1], None)
    else:
        data[parts[-1]] = value


def compose(bad_config: Mapping[str, Any], all_suspects: Sequence[Suspect], applied: set[str]) -> dict[str, Any]:
    """The bad run's config with every suspect not in `applied` put back to the good end's values."""
    out = copy.deepcopy(dict(bad_config))
    for suspect in all_suspects:
        if suspect.name in applied:
            continue
        for key in suspect.good.keys() | suspect.bad.keys():
            _set(out, key, suspect.good.get(key, ABSENT))
    return out


def reused_pass(
    stage: CachedStage, cfg: DeploymentConfig, ends: Sequence[RunRecord], options: dict[str, Any]
) -> tuple[str, StageResult] | None:
    """The first end whose pass of a cached stage read the same inputs as this experiment's config, and that
    pass as this experiment's result: nothing spent, what the end spent saved. An end's config is read as this
    version reads it (a key added since, with its default), so a version's new setting is not a difference."""
    wanted = inputs_digest(stage, cfg.public(), options)
    for end in ends:
        passed = end.stage(stage.name)
        if passed is None or passed.verdict is not Verdict.PASS:
            continue
        try:
            read = experiment_config(end.config, None).public()
        except K3DeployError:
            continue  # a config this version cannot read: nothing to compare with
        if inputs_digest(stage, read, options) == wanted:
            spent = passed.node_seconds or passed.seconds * len(cfg.cluster.nodes)
            return end.run_id, passed.model_copy(update={"node_seconds": 0.0, "saved_node_seconds": spent})
    return None


# -- what an experiment is judged on ---------------------------------------------------------------------------


class Target(BaseModel):
    """The figure that regressed (the worst of those judged REGRESSED), or the stage that failed and how."""

    kind: Literal["figure", "failure"]
    key: str  # "bench random c2 output_throughput", or the failed stage
    stage: str  # the stage that produces it: an experiment runs from launch to here
    higher_is_better: bool | None = None
    good: float | None = None  # the figure in the good and the bad run
    bad: float | None = None
    failure_class: FailureClass | None = None

    def describe(self) -> str:
        if self.kind == "failure":
            return f"{self.key} fails ({self.failure_class.value if self.failure_class else 'unclassified'})"
        return f"{self.key}: {self.good:.4g} in the good run, {self.bad:.4g} in the bad one"


def target_of(good: RunRecord, bad: RunRecord, regressed: Sequence[str]) -> Target:
    """What to judge experiments on: a failed run's stage and class; else the regressed figure that moved most."""
    if bad.verdict == "fail":
        stage = bad.failed_stage or "?"
        return Target(kind="failure", key=stage, stage=stage,
                      failure_class=bad.failure.failure_class if bad.failure else None)  # fmt: skip
    have_good, have_bad = figures(good), figures(bad)
    moved = []
    for key in regressed:
        if key in have_good and key in have_bad and have_good[key].value:
            g, b = have_good[key], have_bad[key]
            worse = (g.value - b.value) if g.higher_is_better else (b.value - g.value)
            moved.append((worse / abs(g.value), key))
    if not moved:
        raise K3DeployError(
            f"run {bad.run_id} is not REGRESSED against run {good.run_id} on any figure both have: nothing to bisect"
        )
    _, key = max(moved)
    g, b = have_good[key], have_bad[key]
    return Target(kind="figure", key=key, stage=key.split()[0], higher_is_better=g.higher_is_better,
                  good=g.value, bad=b.value)  # fmt: skip


@dataclass(frozen=True)
class Judgement:
    reproduces: bool | None  # None: the experiment shows nothing either way (it failed elsewhere, no figure)
    value: float | None
    spread: list[float]  # min and max over the cell's repeats (empty: one repeat)
    evidence: str


def judge_experiment(target: Target, record: RunRecord) -> Judgement:
    """Does this experiment's run reproduce the bad end: the same stage failing the same way, or the figure
    on the bad end's side of the midpoint between the two ends?"""
    failed = record.failed_stage
    if target.kind == "failure":
        if failed is None:
            return Judgement(False, None, [], f"{target.stage} passed")
        cause = record.failure.describe() if record.failure else "no cause recorded"
        same_class = record.failure is not None and record.failure.failure_class == target.failure_class
        if failed == target.stage and same_class:
            return Judgement(True, None, [], f"{failed} failed: {cause}")
        return Judgement(None, None, [], f"failed at {failed} otherwise: {cause}")
    if failed is not None:
        cause = record.failure.describe() if record.failure else ""
        return Judgement(None, None, [], f"failed at {failed}, so no figure: {cause}")
    figure = figures(record).get(target.key)
    if figure is None:
        return Judgement(None, None, [], f"the run has no {target.key}")
    assert target.good is not None and target.bad is not None
    where = way_to_bad(figure.value, target.good, target.bad)
    worse = where > 0.5
    spread = _spread(record, target.key)
    side = "the bad end's" if worse else "the good end's"
    evidence = (f"{figure.value:.4g} (good end {target.good:.4g}, bad end {target.bad:.4g}; {where:.0%} of the way "
                f"to the bad end): {side} side")  # fmt: skip
    if spread:
        evidence += f"; repeats {' – '.join(f'{v:.4g}' for v in spread)}"
    return Judgement(worse, figure.value, spread, evidence)


def way_to_bad(value: float, good: float, bad: float) -> float:
    """How far `value` lies from the good end (0) to the bad end (1); past 0.5 it is on the bad end's side.

    Measured on a log scale when both ends are positive: a latency or a throughput moves by a factor under a
    machine's load (a bad end of 2602 ms read 1264 ms when run again on a busier machine, against a good end of
    116 ms: the bad side by its factor, the good side by a linear midpoint). Otherwise linearly."""
    if good > 0 and bad > 0 and value > 0:
        good, bad, value = math.log(good), math.log(bad), math.log(value)
    span = bad - good
    return (value - good) / span if span else 0.0


def _spread(record: RunRecord, key: str) -> list[float]:
    bench = record.stage("bench")
    workload, concurrency, metric = key.split()[1:] if key.startswith("bench ") else ("", "", "")
    for cell in bench.data.get("cells", []) if bench else []:
        if cell.get("workload") == workload and f"c{cell.get('concurrency')}" == concurrency and cell["repeats"] > 1:
            return [float(v) for v in cell.get("spread", {}).get(metric, [])]  # min and max over the repeats
    return []


# -- the search --------------------------------------------------------------------------------------------------


class BisectVerdict(StrEnum):
    CULPRIT = "culprit"
    INTERACTION = "interaction"  # no single suspect reproduces it, a combination does
    NOT_REPRODUCIBLE = "not reproducible"  # noise or the environment, not a change
    UNDECIDED = "undecided"  # the experiment budget ran out first


class Outcome(BaseModel):
    verdict: BisectVerdict
    culprits: list[str] = Field(default_factory=list, description="The suspects blamed (or the smallest set so far).")
    reason: str
    failure_class: FailureClass | None = None


@dataclass(frozen=True)
class Need:
    """The next experiment: these suspects at the bad end's values, the rest at the good end's."""

    applied: frozenset[str]


class _Missing(Exception):
    def __init__(self, applied: frozenset[str]) -> None:
        self.applied = applied


def next_step(
    names: Sequence[str], done: Mapping[frozenset[str], bool | None], budget: int, target: Target
) -> Need | Outcome:
    """The experiment needed next, or the outcome once the done ones (applied set → reproduces) decide it."""
    full = frozenset(names)
    best = [full]

    def test(applied: frozenset[str]) -> bool:
        if applied not in done:
            raise _Missing(applied)
        if done[applied] is True and len(applied) < len(best[0]):
            best[0] = applied
        return done[applied] is True

    try:
        if not test(full):
            return Outcome(verdict=BisectVerdict.NOT_REPRODUCIBLE,
                           reason="the bad end, run again, does not reproduce it: noise or the environment at the "
                                  "time, not a change")  # fmt: skip
        if test(frozenset()):
            return Outcome(verdict=BisectVerdict.NOT_REPRODUCIBLE,
                           reason="the good end, run again, reproduces it too: the environment (nodes, load), not a "
                                  "change")  # fmt: skip
        if not names:
            return Outcome(verdict=BisectVerdict.NOT_REPRODUCIBLE,
                           reason="nothing that can be varied differs; only what the nodes bring (see the fixed "
                                  "differences)")  # fmt: skip
        minimal = sorted(_ddmin(sorted(names), test))
    except _Missing as missing:
        if len(done) >= budget:
            return Outcome(verdict=BisectVerdict.UNDECIDED, culprits=sorted(best[0]),
                           reason=f"the budget of {budget} experiments is spent; the smallest set that reproduces it "
                                  f"so far: {', '.join(sorted(best[0])) or '(none)'}")  # fmt: skip
        return Need(missing.applied)
    cls = target.failure_class if target.kind == "failure" else None
    if len(minimal) == 1:
        return Outcome(verdict=BisectVerdict.CULPRIT, culprits=minimal, failure_class=cls,
                       reason=f"{minimal[0]} alone reproduces {target.describe()}")  # fmt: skip
    return Outcome(verdict=BisectVerdict.INTERACTION, culprits=minimal, failure_class=cls,
                   reason=f"no single one reproduces it; together {', '.join(minimal)} do, and leaving out any one of "
                          "them does not")  # fmt: skip


def _ddmin(items: list[str], test: Any) -> list[str]:
    """Zeller's ddmin: a 1-minimal subset of `items` (which reproduces) that still reproduces."""
    n = 2
    while len(items) >= 2:
        chunks = [items[i * len(items) // n : (i + 1) * len(items) // n] for i in range(n)]
        for chunk in chunks:
            if test(frozenset(chunk)):
                items, n = chunk, 2
                break
        else:
            for chunk in chunks if n > 2 else []:
                rest = [i for i in items if i not in chunk]
                if test(frozenset(rest)):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items


def experiment_config(public: Mapping[str, Any], credentials: DeploymentConfig | None) -> DeploymentConfig:
    """An experiment's config from a record's (secrets null), with the secrets of the config given, if any."""
    data = copy.deepcopy(dict(public))
    if credentials is not None:
        for dotted, secret in _secrets(credentials.model_dump(mode="python")):
            _set(data, dotted, secret)
    try:
        return DeploymentConfig.model_validate(data)
    except (ConfigError, ValidationError) as err:
        raise K3DeployError(f"an experiment's config is not valid: {err}") from None


def _secrets(data: Any, prefix: str = "") -> list[tuple[str, SecretStr]]:
    if isinstance(data, SecretStr):
        return [(prefix, data)]
    if isinstance(data, dict):
        return [s for k, v in data.items() for s in _secrets(v, f"{prefix}.{k}" if prefix else str(k))]
    return []
