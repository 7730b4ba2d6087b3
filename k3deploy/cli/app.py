"""The `k3deploy` command line: the app, its global options, and one module per command group.

Every command validates the configuration before anything else starts, and any failure ends as one clear
message and a non-zero exit; `--debug` shows the traceback.

| group | module |
|---|---|
| run, rerun, teardown, plan, config-reference | `pipeline.py` |
| bisect, tune | `campaigns.py` |
| runs, report | `records.py` |
| deploy, server …, cluster … | `operations.py` |
| store … | `store.py` |
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Annotated, NoReturn

import click
import typer

from k3deploy.cli import campaigns, operations, pipeline, records
from k3deploy.cli.common import VERBOSE, err
from k3deploy.cli.store import store_app
from k3deploy.core.errors import ConfigError, K3DeployError

app = typer.Typer(
    help="Bring up Kimi-K3 W4A8 on vLLM-Ascend from bare nodes to a validated, benchmarked service.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for group in (pipeline, campaigns, records, operations):
    app.add_typer(group.commands)  # no name: the group's commands are the app's own
app.add_typer(operations.server_commands, name="server")
app.add_typer(operations.cluster_commands, name="cluster")
app.add_typer(store_app, name="store")


@app.callback()
def options(
    debug: Annotated[bool, typer.Option("--debug", help="Show the traceback of a failure.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show Prefect's log stream live (it always goes to the log file).")
    ] = False,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Talk to (or serve) a Prefect API off this machine without an auth string; warns every time. "
            "Also K3DEPLOY_INSECURE_API=1.",
        ),
    ] = False,
) -> None:
    """Global options (before the command)."""
    VERBOSE["on"] = verbose
    if insecure:
        from k3deploy.cli.server import INSECURE_ENV

        os.environ[INSECURE_ENV] = "1"


INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def _fail(message: str) -> NoReturn:
    for line in message.strip().splitlines() or ["failed"]:
        print(f"k3deploy: error: {line.strip()}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    debug = "--debug" in sys.argv[1:]
    try:
        code = app(standalone_mode=False)  # a typer.Exit comes back as its code here, not raised
        if code == INTERRUPTED:  # typer turns Ctrl-C (KeyboardInterrupt) into this code, silently
            err.print("k3deploy: interrupted")
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as usage:
        usage.show()
        sys.exit(usage.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        err.print("k3deploy: interrupted")
        sys.exit(INTERRUPTED)
    except ConfigError as error:
        if debug:
            traceback.print_exc()
        _fail("\n".join(error.lines))
    except K3DeployError as error:
        if debug:
            traceback.print_exc()
        _fail(str(error))
    except Exception as error:  # a bug or an unexpected library error: still one message
        if debug:
            raise
        _fail(f"{type(error).__name__}: {error} (run again with --debug for the traceback)")
