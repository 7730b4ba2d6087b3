"""The import rule: layers only point down, and no stage package reaches into another's modules.

Layers are folders, bottom to top (docs/architecture.md): k3deploy/core (errors, the stage contract, paths),
blocks/ (configuration), tasks/ (the stages' work, the transports and what stages share), k3deploy/records (the
records, history, reports), flows/ (orchestration), the application (k3deploy/cli, deployments/). A module may
import its own layer and the ones below. A module in no layer's folder fails the test: place it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from k3deploy.flows.registry import FINAL
from k3deploy.flows.registry import STAGES as REGISTRY

ROOT = Path(__file__).parents[2]
PACKAGES = {"k3deploy": "k3deploy", "blocks": "k3deploy.blocks", "tasks": "k3deploy.tasks",
            "flows": "k3deploy.flows", "deployments": "k3deploy.deployments"}  # fmt: skip
# The layers are folders (a file named here is a layer's on its own): bottom to top.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("k3deploy/core",)),
    ("blocks", ("blocks",)),
    ("tasks", ("tasks", "k3deploy/localhub", "k3deploy/localprofile")),
    ("records", ("k3deploy/records",)),
    ("flows", ("flows",)),
    ("application", ("k3deploy/cli", "deployments", "k3deploy/__init__.py", "k3deploy/__main__.py")),
]
NODE_SCRIPTS = "tasks/node"  # run on the nodes by their python3: the standard library only
STAGES = tuple(s.name for s in REGISTRY if s.name != FINAL)  # a new stage's package is held to the rule at once


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = modules()


def layer_of_path(path: Path) -> int | None:
    """The layer whose folder holds `path` (or that names the file)."""
    where = path.relative_to(ROOT).as_posix()
    for index, (_, folders) in enumerate(LAYERS):
        if any(where == f or where.startswith(f + "/") for f in folders):
            return index
    return None


def layer(module: str) -> int | None:
    return layer_of_path(MODULES[module]) if module in MODULES else None


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


def test_every_module_is_in_a_layer_s_folder():
    assert len(MODULES) > 100
    assert [str(p.relative_to(ROOT)) for m, p in MODULES.items() if layer(m) is None] == []


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items() if NODE_SCRIPTS in p.as_posix()))
def test_a_node_script_imports_only_the_standard_library(module: str):
    """A node runs these with its own python3: nothing of k3deploy (but each other) or of PyPI is there."""
    tree = ast.parse(MODULES[module].read_text())
    found = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    found |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
    local = {"k3deploy_node_agent", "k3deploy.tasks.node"}  # the agent as the node's loader names it, or here
    foreign = sorted(m for m in found if m.split(".")[0] not in sys.stdlib_module_names and m not in local)
    assert foreign == [], f"{module} runs on the nodes but imports {foreign}"


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
    scratch.write_text("from k3deploy.cli.app import main\nfrom k3deploy.tasks.smoke import checks\n")
    found = imports(scratch)
    assert {"k3deploy.cli.app", "k3deploy.tasks.smoke.checks"} <= found
    assert [t for t in found if (layer(t) or 0) > layer("k3deploy.tasks.bench.steps")] == ["k3deploy.cli.app"]  # type: ignore[operator]
    assert stage_of("k3deploy.tasks.smoke.checks") != stage_of("k3deploy.tasks.bench.steps")


def test_every_package_folder_is_listed_for_a_plain_install():
    """`pip install .` (not -e) installs only the packages pyproject.toml lists: a folder left out is missing there
    (tasks/conformance was, until this test)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, folders = set(project["packages"]), project["package-dir"]
    found = set()
    for name, folder in {"k3deploy": "k3deploy", **folders}.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            if "__pycache__" not in relative:
                found.add(".".join([name, *relative]))
    assert found - listed == set()
    assert {"k3deploy.tasks.conformance", "k3deploy.cli", "k3deploy.flows"} <= found
