"""A run outlives a short absence of its Prefect server, and ends cleanly, on its own, after a long one.

The stages' own work never waits on the Prefect API; what does (a stage subflow's states, logs, artifacts) is
retried by Prefect's client, which k3deploy sets to keep retrying for the grace (`server.grace_seconds`,
`client_retries`). Meanwhile a watch thread asks the server's /health every POLL_S: when it stops answering, one
line says so and Prefect's own error lines are held back; when it answers again, one line says that. Past the
grace the watch ends the run where it stands, without the server: the running stage is INCONCLUSIVE naming the
server, the stages after it not run, what the run started torn down (teardown needs no server), the record and
report written to the runs folder, the listeners told (the CLI prints the table), and the process exits: its
main thread may be inside Prefect's retries for minutes more.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import httpx
from prefect.logging import get_logger
from prefect.settings import PREFECT_API_URL

from k3deploy.blocks.deployment import DeploymentConfig
from k3deploy.core.errors import K3DeployError
from k3deploy.core.paths import runs_dir
from k3deploy.core.stage import FailureCause, FailureClass, StageResult, Verdict, now
from k3deploy.flows.campaign import LISTENERS, Event, tell
from k3deploy.flows.registry import FINAL
from k3deploy.records.record import RunRecord, build_record, write_record
from k3deploy.records.run_report import write_report_files
from k3deploy.tasks.teardown import remove_servers

POLL_S = 2.0
EXIT_CODE = 1  # not a pass
# Prefect's loggers that print a traceback or a line per failed call while the server is away.
NOISY = ("prefect._internal", "prefect._internal.concurrency", "prefect.events", "prefect.events.clients",
         "prefect.client", "prefect.flow_runs", "prefect.task_runs")  # fmt: skip
# Told the record of a run that ended without its server, before the process exits (the CLI prints its table).
ENDED_WITHOUT_SERVER: list[Callable[[RunRecord], None]] = []

Change = Literal["down", "back", "lost"]


def client_retries(grace_s: float) -> int:
    """Prefect's client waits 2, 4, 8, … s between its retries of a refused call: enough retries to span the
    grace and half as much again (PREFECT_CLIENT_MAX_RETRIES), so a server away for less never fails a call, and
    the watch, not a failed call, ends a run whose server stays away."""
    retries, waited = 0, 0
    while waited < 1.5 * grace_s:
        retries += 1
        waited += 2**retries
    return max(retries, 5)  # never fewer than Prefect's own default


@dataclass
class Absence:
    """The server's answers over time (pure): when it went away, and the change each answer makes."""

    grace_s: float
    down_since: float | None = None
    lost: bool = False

    def observe(self, answered: bool, at: float) -> Change | None:
        if self.lost:
            return None
        if answered:
            back = self.down_since is not None
            self.down_since = None
            return "back" if back else None
        if self.down_since is None:
            self.down_since = at
            return "down"
        if at - self.down_since >= self.grace_s:
            self.lost = True
            return "lost"
        return None

    def away_for(self, at: float) -> float:
        return 0.0 if self.down_since is None else at - self.down_since


def answers(api_url: str, timeout: float = POLL_S) -> bool:
    """The server answers at all (any status, an auth refusal too: it is there)."""
    try:
        httpx.get(f"{api_url.rstrip('/')}/health", timeout=timeout)
    except httpx.HTTPError:
        return False
    return True


@contextmanager
def quiet(loggers: tuple[str, ...] = NOISY) -> Iterator[None]:
    """Prefect's per-call error lines and tracebacks held back (the watch says it in one line). Disabled, not
    levelled: Prefect's internal loggers judge their level by a setting of their own."""
    was = {name: logging.getLogger(name).disabled for name in loggers}
    raising, logging.raiseExceptions = logging.raiseExceptions, False  # "--- Error logging to API ---"
    for name in loggers:
        logging.getLogger(name).disabled = True
    try:
        yield
    finally:
        logging.raiseExceptions = raising
        for name, disabled in was.items():
            logging.getLogger(name).disabled = disabled


@contextmanager
def retrying_refusals() -> Iterator[None]:
    """Prefect's clients retry a refused connection only once they have connected; a stage's subflow makes new ones,
    whose first call would fail at once while the server restarts. The run's server answered at its start: every
    client made during the run is taken as having connected (Prefect's private flag, pinned below 3.10)."""
    from prefect.client.base import PrefectHttpxAsyncClient, PrefectHttpxSyncClient

    patched = [c for c in (PrefectHttpxAsyncClient, PrefectHttpxSyncClient) if "_has_connected" in vars(c())]
    inits = {c: c.__init__ for c in patched}

    def connected(init: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            self._has_connected = True

        return __init__

    for client in patched:
        client.__init__ = connected(inits[client])  # type: ignore[method-assign]
    try:
        yield
    finally:
        for client, init in inits.items():
            client.__init__ = init  # type: ignore[method-assign]


@dataclass
class RunSoFar:
    """What the watch needs to end the run: its identity, its stages in order, and their results so far."""

    run_id: str
    run_name: str | None
    cfg: DeploymentConfig
    stages: list[str]
    started_at: datetime = field(default_factory=now)
    results: list[StageResult] = field(default_factory=list)
    current: str | None = None
    current_started: datetime | None = None
    record: RunRecord | None = None  # written once its stages are done: the watch then only ends the process

    def __call__(self, event: Event) -> None:  # a campaign listener: the stages as they start and end
        if event.kind != "stage":
            return
        if event.result is None:
            self.current, self.current_started = event.name, now()
        else:
            self.results.append(event.result)
            self.current = None

    def cut_short(self, reason: str) -> list[StageResult]:
        """The results so far, the running stage INCONCLUSIVE, the rest not run (teardown comes after)."""
        done = {r.stage for r in self.results}
        rows = list(self.results)
        if self.current is not None and self.current != FINAL:  # an unfinished teardown is done again below
            cause = FailureCause(failure_class=FailureClass.INFRASTRUCTURE, evidence=reason)
            rows.append(StageResult(stage=self.current, verdict=Verdict.INCONCLUSIVE, reason=reason,
                                    started_at=self.current_started or now(), failure=cause))  # fmt: skip
            done.add(self.current)
        for name in self.stages:
            if name not in done and name != FINAL:
                rows.append(StageResult(stage=name, verdict=Verdict.SKIPPED, reason="not run: " + reason))
        return rows


def end_without_server(run: RunSoFar, api_url: str, away_s: float) -> RunRecord:
    """The run's end where it stands: INCONCLUSIVE naming the server, torn down, its record and report written
    (a run past its stages has its record: it stands)."""
    if run.record is not None:
        return run.record
    reason = (f"the Prefect server at {api_url} did not answer for {away_s:.0f} s (server.grace_seconds "
              f"{run.cfg.server.grace_seconds:g})")  # fmt: skip
    rows = run.cut_short(reason)
    started = now()
    try:
        removed = remove_servers(run.cfg)
        names = sorted(n for found in removed.values() for n in found)
        rows.append(StageResult(stage=FINAL, verdict=Verdict.PASS, started_at=started, ended_at=now(),
                                summary=f"removed {len(names)}: {', '.join(names) or 'nothing was serving'}",
                                data={"removed": removed}))  # fmt: skip
    except K3DeployError as err:
        rows.append(StageResult(stage=FINAL, verdict=Verdict.FAIL, started_at=started, ended_at=now(),
                                reason=f"{err} (run `k3deploy teardown -c …`)"))  # fmt: skip
    record = build_record(run.run_id, run.run_name, run.cfg, rows, run.started_at, now())
    write_record(record)
    write_report_files(record, runs_dir())
    return record


@contextmanager
def watch_server(run: RunSoFar) -> Iterator[None]:
    """While inside, the run outlives its server's absence up to the grace and ends on its own past it."""
    api_url = PREFECT_API_URL.value()
    if not api_url:  # an ephemeral server in this process: it cannot go away alone
        yield
        return
    logger = get_logger("k3deploy.server")
    absence = Absence(run.cfg.server.grace_seconds)
    stop = threading.Event()
    held = ExitStack()  # Prefect's error lines, held back while the server is away

    def say(level: int, line: str) -> None:  # the run's log, and one line on the terminal of a CLI run
        logger.log(level, line)
        tell(Event("progress", "server", outcome=line))

    def watch() -> None:
        while not stop.wait(POLL_S):
            at = time.monotonic()
            answered = answers(api_url)
            away = absence.away_for(at)  # before the answer is taken: a return ends the absence
            change = absence.observe(answered, at)
            if change == "down":
                held.enter_context(quiet())
                say(logging.WARNING, f"the Prefect server at {api_url} does not answer: the run goes on for up to "
                    f"{absence.grace_s:g} s (server.grace_seconds) and ends on its own if it stays away")  # fmt: skip
            elif change == "back":
                held.close()
                say(logging.INFO, f"the Prefect server at {api_url} answers again after {away:.0f} s")
            elif change == "lost":
                say(logging.ERROR, f"the Prefect server at {api_url} has not answered for {away:.0f} s: the run ends "
                    "INCONCLUSIVE without it, tearing down what it started and writing its record")  # fmt: skip
                try:
                    record = end_without_server(run, api_url, away)
                    for listener in ENDED_WITHOUT_SERVER:
                        listener(record)
                except Exception as err:  # the process ends all the same: never a run left hanging
                    say(logging.ERROR, f"ending the run without its server failed: {type(err).__name__}: {err} (run "
                        "`k3deploy teardown -c …`)")  # fmt: skip
                os._exit(EXIT_CODE)  # the main thread may wait in Prefect's retries for minutes: the run is over

    LISTENERS.append(run)
    thread = threading.Thread(target=watch, name="k3deploy-server-watch", daemon=True)
    thread.start()
    try:
        with retrying_refusals():
            yield
    finally:
        stop.set()
        LISTENERS.remove(run)
        held.close()
