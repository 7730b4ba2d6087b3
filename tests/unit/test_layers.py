"""The import rule: layers only point down, and no stage package reaches into another's modules.

Layers, bottom to top (docs/architecture.md): the base (errors, the stage contract, paths),
blocks (configuration), tasks (the stages' work, the transports and what stages share), the record and
its history and report, flows (orchestration), the application (CLI, server, deployments). A module
may import its own layer and the ones below. A module that is in no layer fails the test: place it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = {"k3deploy": "k3deploy", "blocks": "k3deploy.blocks", "tasks": "k3deploy.tasks",
            "flows": "k3deploy.flows", "deployments": "k3deploy.deployments"}  # fmt: skip
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("k3deploy.errors", "k3deploy.stage", "k3deploy.agreement", "k3deploy.paths")),
    ("blocks", ("k3deploy.blocks",)),
    ("tasks", ("k3deploy.tasks", "k3deploy.localhub", "k3deploy.localprofile")),
    (
        "record",
        (
            "k3deploy.alerts",
            "k3deploy.charts",
            "k3deploy.record",
            "k3deploy.history",
            "k3deploy.report",
            "k3deploy.run_report",
            "k3deploy.bisect_search",
            "k3deploy.bisect_record",
            "k3deploy.tune_record",
            "k3deploy.tune_report",
        ),
    ),
    (
        "flows",
        (
            "k3deploy.flows",
            "k3deploy.run_options",
            "k3deploy.cluster_lock",
            "k3deploy.cluster_hold",
            "k3deploy.run_abort",
            "k3deploy.tune_matrix",
        ),
    ),
    (
        "application",
        (
            "k3deploy.cli",
            "k3deploy.cli_output",
            "k3deploy.cli_store",
            "k3deploy.rerun",
            "k3deploy.server",
            "k3deploy.run_log",
            "k3deploy.deployments",
            "k3deploy.__main__",
            "k3deploy",
        ),
    ),
]
STAGES = ("preflight", "models", "comm", "image", "launch", "smoke", "bench", "accuracy")


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = modules()


def layer(module: str) -> int | None:
    """The layer of the longest prefix that names `module` (k3deploy.tasks.x before k3deploy)."""
    best: tuple[int, int] | None = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return best[1] if best else None


def imports(path: Path) -> set[str]:
    """The project modules a file imports (a `from pkg import name` of a submodule counts as that module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found |= {n for n in names if n in MODULES}
    return found


def stage_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "tasks" and parts[2] in STAGES else None


def test_every_module_is_in_a_layer():
    assert len(MODULES) > 100
    assert [m for m in MODULES if layer(m) is None] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_its_layer_and_the_ones_below(module: str):
    mine = layer(module)
    assert mine is not None
    upward = sorted(f"{t} ({LAYERS[layer(t)][0]})" for t in imports(MODULES[module]) if (layer(t) or 0) > mine)  # type: ignore[index]
    assert upward == [], f"{module} ({LAYERS[mine][0]}) imports a layer above it: {upward}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if stage_of(m)))
def test_no_stage_package_imports_another_stages_modules(module: str):
    other = sorted(t for t in imports(MODULES[module]) if stage_of(t) not in (None, stage_of(module)))
    assert other == [], f"{module} reaches into another stage: {other}; move what they share to tasks/"


def test_the_rule_catches_an_upward_import(tmp_path: Path):
    """The rule itself: a task importing the CLI is refused (what a scratch module of tasks/ would do)."""
    scratch = tmp_path / "scratch.py"
    scratch.write_text("from k3deploy.cli import main\nfrom k3deploy.tasks.smoke import checks\n")
    found = imports(scratch)
    assert {"k3deploy.cli", "k3deploy.tasks.smoke.checks"} <= found
    assert [t for t in found if (layer(t) or 0) > layer("k3deploy.tasks.bench.steps")] == ["k3deploy.cli"]  # type: ignore[operator]
    assert stage_of("k3deploy.tasks.smoke.checks") != stage_of("k3deploy.tasks.bench.steps")
