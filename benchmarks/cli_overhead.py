"""CLI and Prefect overhead (issue 11): what a `k3deploy rerun` costs beyond its stage's own work.

Why: a rerun of an unchanged stage should cost seconds, and before issue 11 every CLI command ran on
Prefect's temporary ("ephemeral") server, which starts a server process, migrates its database and
waits for it (~15 s) each time. The CLI now uses $PREFECT_API_URL, or starts one server of its own
on loopback once (K3DEPLOY_HOME) and reuses it. This measures both, side by side, on the test bed:

* models: `k3deploy rerun -c CFG models` on an unchanged, already verified checkpoint (published on
  the local hub on the bed bridge, downloaded and verified by warm-up runs: nothing hashed, nothing
  fetched, the verification a Prefect cache hit). The warm-up runs name the k3deploy server in
  PREFECT_API_URL: without it, a download's progress updates (made from the node fan-out's worker
  threads, which do not see the settings `k3deploy.cli.server.using` sets in a context variable) start
  Prefect's temporary server in that thread and fail with "404 Artifact not found"; an unchanged
  rerun makes no such update;
* the empty stage: `k3deploy rerun -c CFG teardown` with nothing running (connects to the 4 nodes,
  lists containers, removes nothing);
* the floor: an empty Prefect flow called in this process with the CLI's settings
  (`k3deploy.cli.server.using`), the first call in the process and later calls; and the bare imports
  (`python3 -c "import k3deploy.cli.app, <the stage's flow module>"`), which every command pays, and
  `k3deploy plan -c CFG` (start-up and config validation, no Prefect server involved);
* the old way: the same flow with no PREFECT_API_URL and no k3deploy server, so Prefect starts its
  temporary server in the process (`python3 -c` importing the stage's flow and calling it, with the
  settings `using` sets other than the API URL, so that only the server differs);
* the first command that has to start k3deploy's server (a fresh K3DEPLOY_HOME, hence a fresh
  database) against the next command, which reuses it.

"Stage's own work" is the flow run's duration as Prefect recorded it (end_time - start_time, read
from the server's API, or for the temporary server from its SQLite database once the command has
ended); overhead = the command's wall time - that. The cases are interleaved repetition by
repetition, so that a change of machine load touches all of them alike. Every server this starts
is stopped at the end; the checkpoint is removed from the nodes.

    python3 -m testbed up --hosts 4
    python3 -m benchmarks.cli_overhead [--repeat 3] [--json out.json]

Prints progress on stderr, then a JSON summary and Markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = "k3bench/clioverhead"  # its own path on the nodes: /srv/models/clioverhead
NODE_PATH = "/srv/models/clioverhead"
TIMEOUT_S = 600
STARTING = "starting a local Prefect server"  # what the CLI says when it has to start its server

# The old way: Prefect's temporary server in the command's own process, the settings `using` sets but the API URL.
EPHEMERAL = """
import importlib, sys
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, PREFECT_SERVER_ANALYTICS_ENABLED, temporary_settings
module, attribute = sys.argv[1].split(":")
flow = getattr(importlib.import_module(module), attribute)
with temporary_settings({PREFECT_SERVER_ANALYTICS_ENABLED: False, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
    print(flow(config=sys.argv[2]).model_dump_json())
"""


@dataclass
class Sample:
    wall: float  # the whole command (or call), seconds
    flow: float | None = None  # the flow run's own duration as Prefect recorded it
    note: str = ""
    load: float = field(default_factory=lambda: round(os.getloadavg()[0], 1))  # 1-min load average as it ended

    @property
    def overhead(self) -> float | None:
        return None if self.flow is None else self.wall - self.flow


@dataclass
class Case:
    key: str
    label: str
    samples: list[Sample] = field(default_factory=list)

    def stats(self, attribute: str) -> dict[str, float] | None:
        values = [v for s in self.samples if (v := getattr(s, attribute)) is not None]
        if not values:
            return None
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    def summary(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "runs": len(self.samples),
            "wall_s": self.stats("wall"),
            "flow_s": self.stats("flow"),
            "overhead_s": self.stats("overhead"),
            "samples": [asdict(s) | {"overhead": s.overhead} for s in self.samples],
        }


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {line}", file=sys.stderr, flush=True)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any Prefect setting or K3DEPLOY_HOME, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "K3DEPLOY_HOME"}
    return env | extra


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str, str]:
    """Run a command to its end; its wall time, stdout and stderr. A failure stops the benchmark."""
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} -> rc {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return wall, proc.stdout, proc.stderr


def k3deploy(*args: str) -> list[str]:
    """The installed console script beside this interpreter (not a pyenv shim, whose own start-up is no k3deploy's)."""
    script = Path(sys.executable).with_name("k3deploy")
    return [str(script) if script.exists() else shutil.which("k3deploy") or "k3deploy", *args]


def server_url(home: Path) -> str:
    return str(json.loads((home / "prefect-server.json").read_text())["url"])


def newest_flow_seconds_api(url: str, flow_name: str) -> float:
    """Duration of the newest run of `flow_name` on the server at `url` (which must have completed)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    from k3deploy.cli.server import ServerInfo, using

    with using(ServerInfo(url, None)), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])), sort=FlowRunSort.START_TIME_DESC, limit=1
        )
    run = runs[0]
    if run.state_type is None or run.state_type.value != "COMPLETED" or not (run.start_time and run.end_time):
        raise SystemExit(f"newest {flow_name} flow run {run.id} at {url} is {run.state_type}, not completed")
    return (run.end_time - run.start_time).total_seconds()


def newest_flow_seconds_sqlite(database: Path, flow_name: str) -> float:
    """The same, read from a temporary server's database once its command has ended."""
    with contextlib.closing(sqlite3.connect(database)) as db:
        row = db.execute(
            "SELECT r.start_time, r.end_time, r.state_type FROM flow_run r JOIN flow f ON f.id = r.flow_id"
            " WHERE f.name = ? AND r.start_time IS NOT NULL ORDER BY r.start_time DESC LIMIT 1",
            (flow_name,),
        ).fetchone()
    if row is None or row[2] != "COMPLETED":
        raise SystemExit(f"newest {flow_name} flow run in {database}: {row}")
    start, end = (datetime.fromisoformat(v) for v in row[:2])
    return (end - start).total_seconds()


def unchanged(output: str) -> str:
    """From a models result (JSON): files hashed and fetched over all nodes; raises unless both are 0."""
    data = json.loads(output[output.index("{") :])
    rows = [r for c in data["data"]["checkpoints"] for r in c["nodes"]]
    hashed, fetched = sum(r["hashed files"] for r in rows), sum(r["downloaded files"] for r in rows)
    if data["verdict"] != "pass" or hashed or fetched:
        raise SystemExit(f"models rerun was not a no-op: verdict {data['verdict']}, {hashed} hashed, {fetched} fetched")
    return f"{len(rows)} nodes, 0 hashed, 0 fetched"


class Bench:
    """The temp folders, the config and the servers of one benchmark run."""

    def __init__(self, folder: Path, config: str) -> None:
        self.folder, self.config = folder, config
        self.runs = str(folder / "runs")
        self.home = folder / "k3deploy-home"  # the k3deploy server reused by every measured command
        self.homes: list[Path] = []  # every K3DEPLOY_HOME whose server must be stopped at the end
        self.ephemeral_home = folder / "ephemeral-prefect"

    def own_env(self, home: Path) -> dict[str, str]:
        self.homes += [] if home in self.homes else [home]
        return clean_env(
            K3DEPLOY_HOME=str(home), K3DEPLOY_RUNS_DIR=self.runs, PREFECT_HOME=str(self.folder / "cli-prefect")
        )

    def ephemeral_env(self) -> dict[str, str]:
        return clean_env(
            K3DEPLOY_RUNS_DIR=self.runs,
            PREFECT_HOME=str(self.ephemeral_home),
            PREFECT_SERVER_EPHEMERAL_ENABLED="true",
            # Prefect's default is 20 s, which this loaded 2-core machine sometimes misses (one of
            # issue 11's complaints); a longer deadline keeps a miss from ending the benchmark, at the same cost.
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
        )

    def cli(self, stage: str, home: Path | None = None, api_url: str | None = None) -> tuple[Sample, str, str]:
        """`k3deploy rerun -c CFG STAGE -f json` on the server of `home` (given as PREFECT_API_URL with `api_url`)."""
        home = home or self.home
        env = self.own_env(home) | ({"PREFECT_API_URL": api_url} if api_url else {})
        wall, stdout, stderr = timed(k3deploy("rerun", "-c", self.config, stage, "-f", "json"), env)
        return Sample(wall, newest_flow_seconds_api(server_url(home), stage)), stdout, stderr

    def ephemeral(self, stage: str) -> tuple[Sample, str]:
        from k3deploy.flows.registry import stage as find

        argv = [sys.executable, "-c", EPHEMERAL, find(stage).flow, self.config]
        wall, stdout, _ = timed(argv, self.ephemeral_env())
        return Sample(wall, newest_flow_seconds_sqlite(self.ephemeral_home / "prefect.db", stage)), stdout

    def imports(self, stage: str) -> Sample:
        from k3deploy.flows.registry import stage as find

        module = find(stage).flow.split(":")[0]
        wall, _, _ = timed([sys.executable, "-c", f"import k3deploy.cli.app, {module}"], self.own_env(self.home))
        return Sample(wall)

    def stop_servers(self) -> None:
        for home in self.homes:
            state = home / "prefect-server.json"
            if not state.exists():
                continue
            subprocess.run(k3deploy("server", "stop"), env=self.own_env(home), capture_output=True, timeout=60)
            if state.exists():  # it did not answer, so `stop` did not know it: end it by its recorded pid
                with contextlib.suppress(OSError, ValueError, KeyError):
                    os.killpg(int(json.loads(state.read_text())["pid"]), signal.SIGTERM)
                state.unlink(missing_ok=True)


def empty_flow_samples(url: str, count: int) -> tuple[Sample, list[Sample]]:
    """An empty flow called here with the CLI's settings: the first call in this process, then later calls."""
    from prefect import flow

    from k3deploy.cli.server import ServerInfo, using

    def nothing() -> None:
        return None

    empty = flow(name="k3bench-empty")(nothing)
    samples = []
    with using(ServerInfo(url, None)):
        for _ in range(count + 1):
            started = time.perf_counter()
            empty()
            samples.append(Sample(time.perf_counter() - started))
            samples[-1].flow = newest_flow_seconds_api(url, "k3bench-empty")
    return samples[0], samples[1:]


@contextlib.contextmanager
def checkpoint_on_hub(bed: Any, folder: Path) -> Iterator[str]:
    """A small checkpoint published on a hub on the bed bridge; its folder removed from the nodes around it."""
    from k3deploy.localhub import HubServer, publish
    from tests.bedconfig import bed_transports
    from tests.checkpoints import checkpoint_files

    transports = bed_transports(bed)

    def clear() -> None:
        for t in transports.values():
            t.run(f"rm -rf {NODE_PATH}", 60).check()

    clear()
    (folder / "hub").mkdir()
    try:
        with HubServer(folder / "hub", host=bed.state.bridge["ip"]) as hub:
            files: dict[str, bytes | Path] = dict(checkpoint_files(11))
            publish(hub.root, REPO, files)
            yield hub.url
    finally:
        clear()
        for t in transports.values():
            t.close()


def measure(bench: Bench, repeat: int) -> tuple[dict[str, Case], dict[str, Any]]:
    cases = {
        key: Case(key, label)
        for key, label in (
            ("models_own", "`rerun models`, unchanged — k3deploy's server (reused)"),
            ("models_ephemeral", "`models` flow, unchanged — Prefect's temporary server"),
            ("teardown_own", "`rerun teardown`, nothing running — k3deploy's server (reused)"),
            ("teardown_ephemeral", "`teardown` flow, nothing running — Prefect's temporary server"),
            ("empty_first", "empty flow in-process, first call (CLI settings, k3deploy's server)"),
            ("empty_later", "empty flow in-process, later calls"),
            ("imports_models", "`python3 -c 'import k3deploy.cli.app, k3deploy.flows.models'`"),
            ("imports_teardown", "`python3 -c 'import k3deploy.cli.app, k3deploy.flows.teardown'`"),
            ("plan", "`k3deploy plan -c CFG`: start-up and config validation, no Prefect server"),
            ("cold_teardown", "`rerun teardown`, first command: starts k3deploy's server (fresh home)"),
            ("warm_teardown", "`rerun teardown`, the next command: reuses it"),
        )
    }
    extra: dict[str, Any] = {}

    say("warm-up: teardown through k3deploy's server (the first command: starts it)")
    first, _, stderr = bench.cli("teardown")
    if STARTING not in stderr:
        raise SystemExit(f"the first command did not start a server of its own (is one recorded in {bench.home}?)")
    extra["first_command_teardown"] = asdict(first)
    say("warm-up: models through the same server, named in PREFECT_API_URL (downloads, verifies on 4 nodes)")
    url = server_url(bench.home)
    download, _, _ = bench.cli("models", api_url=url)
    extra["first_models_download"] = asdict(download)
    for _ in range(2):  # the manifests then vouch for the files, then the verification is a cache hit
        bench.cli("models", api_url=url)
    say("warm-up: models and teardown through Prefect's temporary server (creates its database and cache records)")
    for _ in range(2):
        bench.ephemeral("models")
    bench.ephemeral("teardown")

    for rep in range(1, repeat + 1):
        say(f"repetition {rep}/{repeat}")
        sample, stdout, stderr = bench.cli("models")
        sample.note = unchanged(stdout)
        if STARTING in stderr:
            raise SystemExit("a measured command started a server: the reused one went away")
        cases["models_own"].samples.append(sample)
        sample, stdout = bench.ephemeral("models")
        sample.note = unchanged(stdout)
        cases["models_ephemeral"].samples.append(sample)
        cases["teardown_own"].samples.append(bench.cli("teardown")[0])
        cases["teardown_ephemeral"].samples.append(bench.ephemeral("teardown")[0])
        cases["imports_models"].samples.append(bench.imports("models"))
        cases["imports_teardown"].samples.append(bench.imports("teardown"))
        cases["plan"].samples.append(Sample(timed(k3deploy("plan", "-c", bench.config), bench.own_env(bench.home))[0]))
        say(
            "  "
            + ", ".join(
                f"{c.key} {c.samples[-1].wall:.2f}s" for c in cases.values() if c.samples and len(c.samples) == rep
            )
        )

    say(f"empty flow in this process, {repeat + 1} calls")
    first_call, later = empty_flow_samples(server_url(bench.home), repeat)
    cases["empty_first"].samples.append(first_call)
    cases["empty_later"].samples += later

    for rep in range(1, repeat + 1):
        home = bench.folder / f"cold-home-{rep}"
        say(f"first command on a fresh K3DEPLOY_HOME {rep}/{repeat}")
        cold, _, stderr = bench.cli("teardown", home)
        if STARTING not in stderr:
            raise SystemExit(f"the first command on {home} did not start a server")
        warm, _, stderr = bench.cli("teardown", home)
        if STARTING in stderr:
            raise SystemExit(f"the second command on {home} started a server again")
        cases["cold_teardown"].samples.append(cold)
        cases["warm_teardown"].samples.append(warm)
        subprocess.run(k3deploy("server", "stop"), env=bench.own_env(home), capture_output=True, timeout=60)
        say(f"  cold {cold.wall:.2f}s, warm {warm.wall:.2f}s")
    return cases, extra


def fmt(stats: dict[str, float] | None) -> str:
    if stats is None:
        return "–"
    return f"{stats['median']:.2f} ({stats['min']:.2f}–{stats['max']:.2f})"


def ratio(cases: dict[str, Case], old: str, new: str, attribute: str) -> float | None:
    a, b = cases[old].stats(attribute), cases[new].stats(attribute)
    return None if not a or not b or b["median"] <= 0 else a["median"] / b["median"]


def machine() -> dict[str, Any]:
    import prefect

    nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    return {
        "machine": platform.machine(),
        "nproc": nproc,
        "python": platform.python_version(),
        "prefect": prefect.__version__,
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of every case (median, min–max)")
    parser.add_argument("--json", type=Path, help="also write the JSON summary here")
    args = parser.parse_args()

    from testbed.layout import load_state, resolve_state_file
    from testbed.pytest_plugin import Testbed
    from tests.bedconfig import bed_config, write_config

    bed = Testbed.from_state(load_state(resolve_state_file(None)))
    folder = Path(tempfile.mkdtemp(prefix="k3-cli-overhead-"))
    before = machine()
    say(f"folder {folder}; {before}")
    try:
        with checkpoint_on_hub(bed, folder) as hub_url:
            data = bed_config(
                bed, models__hub="huggingface", models__hub_endpoint=hub_url, models__target={"repo": REPO}
            )
            bench = Bench(folder, write_config(folder / "deploy.yaml", data))
            try:
                cases, extra = measure(bench, args.repeat)
            finally:
                bench.stop_servers()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = {
        "command": f"python3 -m benchmarks.cli_overhead --repeat {args.repeat}",
        "machine": before,
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "ratios_ephemeral_over_own": {
            "models_wall": ratio(cases, "models_ephemeral", "models_own", "wall"),
            "models_overhead": ratio(cases, "models_ephemeral", "models_own", "overhead"),
            "teardown_wall": ratio(cases, "teardown_ephemeral", "teardown_own", "wall"),
            "teardown_overhead": ratio(cases, "teardown_ephemeral", "teardown_own", "overhead"),
        },
        "ratio_first_over_next_command_wall": ratio(cases, "cold_teardown", "warm_teardown", "wall"),
        **extra,
        "cases": {key: case.summary() for key, case in cases.items()},
    }
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    print(
        f"\nMachine: {before['machine']}, nproc {before['nproc']}, Python {before['python']}, "
        f"Prefect {before['prefect']}; 4 bed hosts; load average {before['load_average'][0]:.1f} before, "
        f"{summary['load_average_after'][0]:.1f} after; `{summary['command']}`\n"
    )
    print("| case | runs | wall s, median (min–max) | stage's own work s | overhead s |")
    print("|---|---:|---:|---:|---:|")
    for case in cases.values():
        print(
            f"| {case.label} | {len(case.samples)} | {fmt(case.stats('wall'))} | {fmt(case.stats('flow'))} "
            f"| {fmt(case.stats('overhead'))} |"
        )
    print("\n| temporary server / k3deploy's server (medians) | ratio |")
    print("|---|---:|")
    for key, value in summary["ratios_ephemeral_over_own"].items():
        print(f"| {key.replace('_', ' ')} | {'–' if value is None else f'{value:.1f}×'} |")
    first = summary["ratio_first_over_next_command_wall"]
    print(f"\nfirst command (starts the server) / the next one (reuses it), wall: {first or 0:.1f}×")
    for key, what in (
        ("first_command_teardown", "first teardown (starts the server)"),
        ("first_models_download", "first models run (download and verify on 4 nodes, PREFECT_API_URL)"),
    ):
        print(f"{what}: wall {extra[key]['wall']:.2f} s, flow run {extra[key]['flow']:.2f} s")


if __name__ == "__main__":
    main()
