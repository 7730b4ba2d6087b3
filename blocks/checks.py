"""Cross-field rules of a deployment, as a pure function returning (field, problem) pairs."""

from __future__ import annotations

import re
from string import Template
from typing import TYPE_CHECKING, Any

from k3deploy.blocks.models import KNOWN_DRAFTS, SPECULATIVE_TOKENS
from k3deploy.blocks.serve import DERIVED_ENV

if TYPE_CHECKING:
    from k3deploy.blocks.deployment import DeploymentConfig

Problem = tuple[str, str]
PLACEHOLDER = re.compile(r"<[A-Z0-9][A-Z0-9_]*>")


def placeholders(data: Any, path: str = "") -> list[Problem]:
    """Every `<NAME>` placeholder left in raw configuration data, with its field path."""
    found: list[Problem] = []
    if isinstance(data, dict):
        for key, value in data.items():
            found += placeholders(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += placeholders(value, f"{path}[{i}]")
    elif isinstance(data, str):
        for match in PLACEHOLDER.findall(data):
            found.append((path, f"placeholder {match} left in the configuration; set the site value"))
    return found


def _topology(cfg: DeploymentConfig) -> list[Problem]:
    serve, cluster = cfg.serve, cfg.cluster
    dp, tp, local = serve.data_parallel_size, serve.tensor_parallel_size, serve.data_parallel_size_local
    nodes = len(cluster.nodes)
    offered = nodes * cluster.npus_per_node
    problems: list[Problem] = []
    if dp % local:
        problems.append(("serve.data_parallel_size_local", f"{local} does not divide data_parallel_size {dp}"))
    elif dp // local != nodes:
        problems.append(
            (
                "cluster.nodes",
                f"{nodes} nodes listed but data_parallel_size / data_parallel_size_local = "
                f"{dp} / {local} = {dp // local} nodes are needed",
            )
        )
    if cluster.npus_per_node > 0 and dp * tp != offered:  # 0 declares no NPUs: nothing to fit the ranks onto
        problems.append(
            (
                "serve.tensor_parallel_size",
                f"DP × TP = {dp} × {tp} = {dp * tp} ranks, but the cluster offers {offered} NPUs "
                f"({nodes} nodes × {cluster.npus_per_node})",
            )
        )
    if serve.enable_expert_parallel and serve.expert_parallel_size not in (None, dp * tp):
        problems.append(
            (
                "serve.expert_parallel_size",
                f"expert parallel spans DP × TP = {dp * tp} ranks, not {serve.expert_parallel_size}",
            )
        )
    return problems


def _nodes(cfg: DeploymentConfig) -> list[Problem]:
    """Names are always distinct; addresses too where each node is a host of its own (SSH). With
    `transport: local` every node is this machine, so the nodes share its addresses by definition."""
    problems: list[Problem] = []
    unique = [("name", "name")]
    if cfg.cluster.transport == "ssh":
        unique += [("address", "address"), ("serving_ip", "local_ip")]
    for attr, label in unique:
        seen: dict[str, int] = {}
        for i, node in enumerate(cfg.cluster.nodes):
            value = getattr(node, attr)
            if value in seen:
                problems.append(
                    (f"cluster.nodes[{i}].{label}", f"{value!r} is already used by cluster.nodes[{seen[value]}]")
                )
            seen.setdefault(value, i)
    return problems


def _ports(cfg: DeploymentConfig) -> list[Problem]:
    if cfg.serve.service_port == cfg.serve.rpc_port:
        return [("serve.rpc_port", f"{cfg.serve.rpc_port} is also serve.service_port; use two ports")]
    return []


def _paths(cfg: DeploymentConfig) -> list[Problem]:
    root = cfg.cluster.model_root.rstrip("/") + "/"
    problems: list[Problem] = []
    checked = [("models.target.path", cfg.models.target.path), ("models.tokenizer_path", cfg.models.tokenizer_path)]
    if cfg.models.draft is not None:
        checked.append(("models.draft.path", cfg.models.draft.path))
    for field, path in checked:
        if path is not None and not path.startswith(root):
            problems.append((field, f"{path} is outside cluster.model_root {root}: the container would not see it"))
    return problems


def _speculative(cfg: DeploymentConfig) -> list[Problem]:
    spec = cfg.serve.speculative_config
    if spec is None:
        return []
    key = "serve.speculative_config"
    if cfg.models.draft is not None:
        return [(key, "give either a draft (models.draft) or a speculative config without one, not both")]
    if not isinstance(spec.get("method"), str) or not spec["method"]:
        return [(key, "needs its method, e.g. ngram")]
    if "model" in spec:
        return [(key, "names no model: a draft checkpoint is models.draft, which the models stage downloads")]
    return []


def _parsers(cfg: DeploymentConfig) -> list[Problem]:
    """What vLLM refuses at start-up ("--enable-auto-tool-choice requires --tool-call-parser"), refused here."""
    serve = cfg.serve
    if serve.enable_auto_tool_choice and serve.tool_call_parser is None:
        why = "is needed by serve.enable_auto_tool_choice (vLLM refuses to start without one): kimi_k3 for K3"
        return [("serve.tool_call_parser", why)]
    return []


def _draft(cfg: DeploymentConfig) -> list[Problem]:
    draft = cfg.models.draft
    if draft is None:
        return []
    problems: list[Problem] = []
    known = KNOWN_DRAFTS.get(draft.repo)
    if known and draft.kind not in (None, known):
        problems.append(("models.draft.kind", f"{draft.repo} is a {known} draft, not {draft.kind}"))
    kind = draft.kind or known
    if kind is None:
        problems.append(("models.draft.kind", f"{draft.repo} is not a known draft: set kind to gqa, mla or mla-block5"))
    elif draft.num_speculative_tokens not in (None, SPECULATIVE_TOKENS[kind]):
        problems.append(
            (
                "models.draft.num_speculative_tokens",
                f"a {kind} draft proposes {SPECULATIVE_TOKENS[kind]} tokens, not {draft.num_speculative_tokens}",
            )
        )
    if draft.max_model_len > cfg.serve.max_model_len:
        problems.append(
            (
                "models.draft.max_model_len",
                f"{draft.max_model_len} is above the target's serve.max_model_len {cfg.serve.max_model_len}",
            )
        )
    return problems


def _env(cfg: DeploymentConfig) -> list[Problem]:
    problems: list[Problem] = []
    for name, value in cfg.serve.env.items():
        field = f"serve.env.{name}"
        if name in DERIVED_ENV:
            problems.append((field, f"{name} is derived from the configuration; set it there, not in env"))
            continue
        template = Template(value)
        if not template.is_valid():
            problems.append((field, f"{value!r} has a stray $; write $$ for a literal dollar sign"))
            continue
        unknown = sorted(set(template.get_identifiers()) - set(DERIVED_ENV))
        if unknown:
            known = ", ".join(DERIVED_ENV)
            problems.append((field, f"refers to {', '.join(unknown)}; only {known} can be referred to"))
    return problems


def _image(cfg: DeploymentConfig) -> list[Problem]:
    image = cfg.image
    if image.build is None and image.digest is None and not image.allow_unpinned:
        return [("image.digest", f"{image.ref} is not pinned: set a sha256 digest, a build, or allow_unpinned")]
    return []


def _accuracy(cfg: DeploymentConfig) -> list[Problem]:
    """A chosen evaluator needs something to evaluate (whether the path exists is checked where it runs)."""
    chosen, problems = cfg.accuracy.evaluators, []
    if "lm_eval" in chosen and not cfg.accuracy.lm_eval.tasks:
        problems.append(("accuracy.lm_eval.tasks", "lm_eval is chosen but no task is named"))
    if "ais_bench" in chosen and cfg.accuracy.ais_bench.dataset_path is None:
        problems.append(("accuracy.ais_bench.dataset_path", "ais_bench is chosen but no dataset file is named"))
    if len(set(chosen)) != len(chosen):
        problems.append(("accuracy.evaluators", f"{chosen}: an evaluator is named twice"))
    return problems


def config_problems(cfg: DeploymentConfig) -> list[Problem]:
    """All cross-field problems, so a person can fix them in one go."""
    return [
        *placeholders(cfg.model_dump(mode="json")),
        *_topology(cfg),
        *_nodes(cfg),
        *_ports(cfg),
        *_paths(cfg),
        *_draft(cfg),
        *_speculative(cfg),
        *_parsers(cfg),
        *_env(cfg),
        *_image(cfg),
        *_accuracy(cfg),
    ]
