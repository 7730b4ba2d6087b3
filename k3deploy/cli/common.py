"""What every command group shares: the consoles, the common options, the config, the Prefect server, the
command's log, and how a finished run is told (its table, its record, its log, its page in the UI)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from k3deploy.core.errors import K3DeployError
from k3deploy.flows.registry import StageOptions

if TYPE_CHECKING:
    from k3deploy.blocks.deployment import DeploymentConfig
    from k3deploy.cli.server import ServerInfo

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

ConfigPath = Annotated[
    Path, typer.Option("--config", "-c", help="Deployment YAML (see configs/), or a saved DeploymentConfig block.")
]
RunsDir = Annotated[
    Path | None, typer.Option("--runs-dir", help="Runs store (default $K3DEPLOY_RUNS_DIR, else ./runs).")
]


class Format(StrEnum):
    text = "text"
    json = "json"


FormatOption = Annotated[Format, typer.Option("--format", "-f", help="text for people, or json.")]


def _stage_flag(field: str, flag: str) -> Any:
    """A flag for one StageOptions field, with the field's description as its help (`--no-…` turns it off)."""
    description = StageOptions.model_fields[field].description or field
    off = flag.startswith("--no-")
    return typer.Option(flag, help=f"{description} This flag turns it off." if off else description)


# The stages' options (flows/registry.py's StageOptions), the same flags for `run` and `rerun`.
Fresh = Annotated[bool, _stage_flag("fresh", "--fresh")]
NoDownload = Annotated[bool, _stage_flag("download", "--no-download")]
FullVerify = Annotated[bool, _stage_flag("full_verify", "--full-verify")]
Capacity = Annotated[bool, _stage_flag("capacity", "--capacity")]
Soak = Annotated[bool, _stage_flag("soak", "--soak")]
SoakRestart = Annotated[bool, _stage_flag("soak_restart", "--soak-restart")]


def stage_options(fresh: bool, no_download: bool, full_verify: bool, capacity: bool = False, soak: bool = False,
                  soak_restart: bool = False) -> StageOptions:  # fmt: skip
    return StageOptions(fresh=fresh, download=not no_download, full_verify=full_verify, capacity=capacity, soak=soak,
                        soak_restart=soak_restart)  # fmt: skip


VERBOSE = {"on": False}  # --verbose, set by the app's callback before any command runs


@contextlib.contextmanager
def flow_log() -> Iterator[Path]:
    """Prefect's log stream of this command into a file under K3DEPLOY_HOME (moved into the run's folder)."""
    from datetime import UTC, datetime

    from k3deploy.cli.run_log import prefect_log
    from k3deploy.cli.server import home

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with prefect_log(home() / "logs" / f"{stamp}-{os.getpid()}.log", VERBOSE["on"]) as path:
        yield path


def keep_log(log: Path, folder: Path) -> Path:
    """The command's log moved into the run's folder as `prefect.log` (left where it is when it cannot be)."""
    target = folder / "prefect.log"
    try:
        shutil.move(log, target)
    except OSError:
        return log
    return target


def load(source: Path | str) -> DeploymentConfig:
    """The deployment, validated before Prefect or any node is touched: a YAML file, or a saved block's name
    (read from the server, with a warning when the block keeps the nodes' SSH key there)."""
    from k3deploy.blocks.loader import load_config
    from k3deploy.blocks.source import is_yaml_path, resolve_config

    if is_yaml_path(str(source)):
        return load_config(source)
    with prefect() as info:
        cfg = resolve_config(str(source))
    if cfg.cluster.ssh.private_key is not None:
        err.print(f"warning: the DeploymentConfig block {source} keeps the nodes' SSH private key on {info.url}: "
                  "whoever can use that server can read it; give cluster.ssh.private_key_file (a path on the worker "
                  "hosts) instead", soft_wrap=True)  # fmt: skip
    return cfg


def flow_source(source: Path | str) -> str:
    """What a flow is given: a YAML file's absolute path (a worker's folder may differ), or the block's name."""
    from k3deploy.blocks.source import is_yaml_path

    return str(Path(source).resolve()) if is_yaml_path(str(source)) else str(source)


def parsed(source: str, cfg: DeploymentConfig) -> contextlib.AbstractContextManager[None]:
    """Inside, the flows this command runs get `cfg` for `source` instead of parsing it again."""
    from k3deploy.blocks.source import parsed as handed_on

    return handed_on(source, cfg)


def set_runs_dir(runs_dir: Path | None) -> None:
    if runs_dir is not None:
        os.environ["K3DEPLOY_RUNS_DIR"] = str(runs_dir)


def pull_shared_runs() -> None:
    """With a server (PREFECT_API_URL) that has a shared store, its runs first: every worker's, from any host."""
    if not os.environ.get("PREFECT_API_URL"):
        return  # no server named: the runs store on this disk is all there is
    from k3deploy.records.run_report import pull_shared_runs as pull

    with prefect():
        said = pull()
    if said:
        err.print(f"runs store: {said}", soft_wrap=True)


@contextlib.contextmanager
def prefect() -> Iterator[ServerInfo]:
    """The Prefect server for this command (started once, reused), with the settings the CLI runs under."""
    from k3deploy.cli import server

    info = server.ensure(lambda line: err.print(line, soft_wrap=True))
    with server.using(info):
        yield info


def show_progress() -> None:
    """Each stage and experiment or cell on stderr as it starts and ends (the campaign engine's listener)."""
    from k3deploy.cli.output import Progress
    from k3deploy.flows.campaign import LISTENERS

    LISTENERS.append(Progress(err))


def finish(
    kind: str, run_id: str, state: Any, ui: str, log: Path, record: Any, show: Callable[[Console, Any], None],
    files: list[tuple[str, str]], passed: bool, judged_by_record: bool = False,
) -> None:  # fmt: skip
    """How every campaign command ends: its table (`show(out, record)`), where its record, report and log are,
    its page in the UI; exit 1 unless it `passed`. No record: the run stopped before writing one, and why is raised. A
    flow run that did not complete raises why, unless `judged_by_record` (a validate run's failed stage is
    its record's verdict, already shown)."""
    from k3deploy.core.paths import run_folder

    if record is None:
        err.print(f"log: {log}")
        state.result()  # raises why it stopped
        raise K3DeployError(f"the {kind} ended without a record")
    folder = run_folder(run_id).resolve()
    out.print()
    show(out, record)
    (record_label, record_name), *others = files
    out.print(f"{record_label}: {folder / record_name}")
    out.print(f"log: {keep_log(log, folder)}")
    for label, name in others:
        if (folder / name).exists():
            out.print(f"{label}: {folder / name}")
    out.print(f"Prefect UI: {ui}/runs/flow-run/{run_id}")
    if not judged_by_record and not state.is_completed():
        state.result()
    if not passed:
        raise typer.Exit(1)
