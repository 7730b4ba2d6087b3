"""The `k3deploy` command line."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from k3deploy.errors import K3DeployError

app = typer.Typer(
    help="Bring up Kimi-K3 W4A8 on vLLM-Ascend from bare nodes to a validated, benchmarked service.",
    no_args_is_help=True,
    add_completion=False,
)

ConfigPath = Annotated[Path, typer.Option("--config", "-c", help="Deployment YAML (see configs/).")]


class Format(StrEnum):
    text = "text"
    json = "json"


@app.command()
def plan(
    config: ConfigPath,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="text (paste-able) or json.")] = Format.text,
) -> None:
    """Print, node by node, the environment, docker run and vllm serve that launch would run."""
    from k3deploy.blocks.loader import load_config
    from k3deploy.tasks.render import render_plan

    try:
        rendered = render_plan(load_config(config))
    except K3DeployError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=1) from None
    if fmt is Format.json:
        typer.echo(json.dumps(rendered.to_json(), indent=2))
    else:
        typer.echo(rendered.to_text(), nl=False)


@app.command("config-reference")
def config_reference() -> None:
    """Print the configuration reference (every key, its default and meaning) as Markdown."""
    from k3deploy.blocks.reference import config_reference as reference

    typer.echo(reference())


def _not_yet(stage: str) -> None:
    typer.echo(f"k3deploy {stage}: not yet available; `k3deploy rerun -c CONFIG STAGE` runs one stage.", err=True)
    raise typer.Exit(code=2)


@app.command()
def run(config: ConfigPath) -> None:
    """Run the whole validate pipeline (not yet available)."""
    _not_yet("run")


# Stages that can run on their own so far: name → "module:flow".
STAGE_FLOWS = {
    "models": "k3deploy.flows.models:models",
    "comm": "k3deploy.flows.comm:comm",
    "image": "k3deploy.flows.image:image",
    "launch": "k3deploy.flows.launch:launch",
    "teardown": "k3deploy.flows.teardown:teardown",
}


@app.command()
def rerun(
    config: ConfigPath,
    stage: Annotated[str, typer.Argument(help=f"Stage to run again: {', '.join(STAGE_FLOWS)}.")],
) -> None:
    """Run one stage again; verified work of earlier runs is reused (cached tasks, node manifests)."""
    if stage not in STAGE_FLOWS:
        typer.echo(f"k3deploy rerun: stage {stage!r} is not available; available: {', '.join(STAGE_FLOWS)}", err=True)
        raise typer.Exit(code=2)
    _run_stage(stage, config)


def _run_stage(stage: str, config: Path) -> None:
    import importlib

    module, name = STAGE_FLOWS[stage].split(":")
    flow = getattr(importlib.import_module(module), name)
    try:
        record = flow(config=str(config))
    except K3DeployError as err:
        typer.echo(f"k3deploy {stage}: {err}", err=True)
        raise typer.Exit(code=1) from None
    typer.echo(json.dumps(record, indent=1))


@app.command()
def teardown(config: ConfigPath) -> None:
    """Stop and remove this config's containers on every node, and prove none is left; safe to repeat."""
    _run_stage("teardown", config)


@app.command()
def report(run_id: Annotated[str, typer.Argument(help="Run to report on.")]) -> None:
    """Show a run's record (not yet available)."""
    _not_yet("report")


def main() -> None:
    app()
