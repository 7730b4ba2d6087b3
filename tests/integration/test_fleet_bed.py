"""The production layout on the test bed: a Prefect server backed by PostgreSQL on the bed's bridge, its API
behind basic authentication, process workers in two bed hosts' network namespaces (each with its own disk:
PREFECT_HOME, runs store), the fleet's shared store on a third bed host over SFTP, two clusters of two bed
nodes each.

What it shows, in order: the blocks the documented set-up leaves on the server hold no private key; a run
on worker A passes and another fails at launch (only A is up); a nightly run holding cluster a can be neither
cancelled nor joined by a new run, nor the blocks' secrets listed, by a client on another bed host without the
auth string (HTTP 401); it dies with worker A (SIGKILL); worker B picks up the UI's Retry of the failed run,
takes the dead run's hold within the stated bound, skips the stage that passed on A (its result is in the
shared store, B's own disk has none) and judges itself against A's run; with A back, both clusters' nightly
runs proceed at once and a second run on cluster a waits; a laptop (a fourth namespace, an empty runs store,
the server's URL and auth string) lists and compares the runs of both workers. Before that, on the same
server: a nightly run killed with its worker mid-bench is marked Crashed and alerted once.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from prefect import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterId,
    FlowRunFilterParentFlowRunId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.states import AwaitingRetry
from prefect.variables import Variable

from k3deploy.blocks.loader import load_config
from k3deploy.blocks.store import RUNS, STORE_NAME, SftpStore, read_file
from k3deploy.deployments.automations import crash_alert_name, crash_marker_name
from k3deploy.deployments.definitions import apply, ensure_pool
from k3deploy.flows.cluster_hold import takeover_bound_s
from k3deploy.flows.cluster_lock import cluster_label, lock_name
from k3deploy.flows.run_labels import STAGE_LABEL
from k3deploy.tasks.transport.sftp_store import listing, shared_store
from tests.bedconfig import write_config
from tests.launchbed import control, launch_data
from tests.postgres import needs_postgres
from tests.prefect_runs import FINISHED, finished, logged, run_logs, wait_for
from tests.prefect_worker import processes_of, started_server, stop_worker
from tests.standin_profile import bench_runs_left, standin_profile
from tests.vllm_env import needs_vllm_env
from tests.webhook import Received, delivered, receiving

pytestmark = [pytest.mark.e2e, pytest.mark.testbed, pytest.mark.prefect, needs_postgres,
              pytest.mark.usefixtures("runs_dir")]  # fmt: skip
# What a client on another host tries with no auth string: each must be refused (HTTP 401) and change nothing.
UNAUTHENTICATED = """
import base64, json, sys, httpx
url, deployment, run, auth = sys.argv[1:5]
headers = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}
with httpx.Client(base_url=url, headers=headers, timeout=30) as api:
    codes = {"list blocks with secrets": api.post("/block_documents/filter", json={"include_secrets": True})}
    if not auth:
        codes["create a flow run"] = api.post(f"/deployments/{deployment}/create_flow_run", json={})
        codes["cancel a flow run"] = api.post(f"/flow_runs/{run}/set_state",
                                              json={"state": {"type": "CANCELLING"}, "force": True})
print(json.dumps({what: response.status_code for what, response in codes.items()}))
"""
BEAT_S = 2.0  # cluster.hold_beat_s of the fleet's clusters: a dead holder is found in 4 beats, not the default's 60 s
LOG_SLACK_S = 15  # the run's own log lines reach the server in batches
CRASH_GRACE_S = 10  # cluster a's server.grace_seconds: its runs are dead after 3 × 30 s + 10 s without a heartbeat
CRASH_BOUND_S = 3 * 30 + CRASH_GRACE_S + 40  # after the kill: that silence, a proactive pass, the POST


def run_with_env(
    command: list[str], netns: str, env: dict[str, str], **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", netns, *command], env=env, capture_output=True, text=True,
                          timeout=300, check=False, **kwargs)  # fmt: skip


@dataclass(frozen=True)
class FleetServer:
    url: str
    auth_string: str  # PREFECT_SERVER_API_AUTH_STRING on the server, PREFECT_API_AUTH_STRING on its clients


@pytest.fixture
def fleet_server(postgres: str, testbed, tmp_path: Path) -> Iterator[FleetServer]:
    """`prefect server start --host <bridge>` on PostgreSQL with its API's basic authentication on, as the
    README's production section runs it."""
    auth_string = secrets.token_urlsafe(24)
    env = os.environ | {
        "PREFECT_SERVER_API_AUTH_STRING": auth_string,
        "PREFECT_HOME": str(tmp_path / "server-home"),
        "PREFECT_API_DATABASE_CONNECTION_URL": postgres,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }
    with started_server(testbed.state.bridge["ip"], env, tmp_path, auth_string) as url:
        yield FleetServer(url, auth_string)


class Fleet:
    """Workers and a laptop, each in a bed host's network namespace with a disk of its own."""

    def __init__(self, server: FleetServer, pool: str, tmp_path: Path) -> None:
        self.url, self.auth_string, self.pool, self.tmp = server.url, server.auth_string, pool, tmp_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, name: str) -> dict[str, str]:
        home = self.tmp / name
        (home / "prefect").mkdir(parents=True, exist_ok=True)
        return os.environ | {
            "PREFECT_API_URL": self.url,
            "PREFECT_API_AUTH_STRING": self.auth_string,
            "PREFECT_HOME": str(home / "prefect"),
            "PREFECT_LOCAL_STORAGE_PATH": str(home / "prefect" / "storage"),
            "K3DEPLOY_RUNS_DIR": str(home / "runs"),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "DO_NOT_TRACK": "1",
        }

    def start(self, name: str, netns: str) -> None:
        log = (self.tmp / f"{name}.log").open("a")
        command = ["ip", "netns", "exec", netns, sys.executable, "-m", "prefect", "worker", "start", "--pool",
                   self.pool, "--type", "process", "--name", name]  # fmt: skip
        self.procs[name] = subprocess.Popen(command, env=self.env(name), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        log.close()

    def kill(self, name: str, run_ids: list[UUID]) -> None:
        """SIGKILL to the worker and to the flow runs it executes: nothing of theirs can run a hook."""
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for run_id in run_ids:
            for pid in processes_of(run_id):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        wait_for("the killed runs' processes to be gone", lambda: not any(processes_of(r) for r in run_ids), 60)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            stop_worker(proc)

    def runs_dir(self, name: str) -> Path:
        return self.tmp / name / "runs"


def cluster_config(testbed, tmp_path: Path, name: str, nodes: list[str], **sections: Any) -> str:
    data = launch_data(testbed, hosts=nodes) | sections
    data["cluster"]["name"] = f"{name}-{uuid4().hex[:6]}"
    data["cluster"]["hold_beat_s"] = BEAT_S
    data["serve"]["readiness"]["timeout_s"] = 900  # a gated start-up holds the cluster until the test opens it
    return write_config(tmp_path / f"{name}.yaml", data)


def holder(config: str) -> str | None:
    value = Variable.get(lock_name(load_config(config).cluster), default=None)
    return value.get("run_id") if isinstance(value, dict) else None


def gate(bed_nodes, nodes: list[str], closed: bool) -> None:
    """A closed gate keeps the stand-in starting up (an hour); opened, it is ready in half a second."""
    for node in nodes:
        control(bed_nodes, node, **({"K3SIM_STARTUP_S": 3600} if closed else {}))


def stage_label(run_id: UUID) -> str | None:
    """The stage the run says it is in (flows/run_labels.py): what its crash alert will name."""
    with get_client(sync_client=True) as client:
        return (client.read_flow_run(run_id).labels or {}).get(STAGE_LABEL)


def submit(deployment: str, **parameters: Any) -> UUID:
    return run_deployment(deployment, parameters=parameters, timeout=0).id


def subflows(run_id: UUID) -> dict[str, list[Any]]:
    """Stage name → its subflow runs under this run, oldest first."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id]))
        )
        names = {r.flow_id: client.read_flow(r.flow_id).name for r in runs}
    out: dict[str, list[Any]] = {}
    for r in sorted(runs, key=lambda r: r.created):
        out.setdefault(names[r.flow_id], []).append(r)
    return out


def stage_tasks(run_id: UUID, stage: str, count: int, within_s: float = 60) -> list[tuple[str, str]]:
    """(state type, state name) of the stage's cached-stage task runs under this run, oldest first.

    The server records task runs from events, after the flow has returned: this reads until it has `count`
    of them, all final, or the bound passes (then what it has, for the assertion to show)."""
    deadline = time.monotonic() + within_s
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        found = [(r.state.type.value, r.state.name) for r in sorted(runs, key=lambda r: r.created)
                 if r.name == stage and r.state is not None]  # fmt: skip
        if (len(found) >= count and all(kind in FINISHED for kind, _ in found)) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)  # polling the server's record, not a wait for the machine


def log_time(run_id: UUID, text: str, after: datetime | None = None, timeout: float = 60) -> datetime:
    """When the run first logged `text` (after `after`), once the server has that line."""

    def first() -> datetime | None:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
        times = [log.timestamp for log in logs if text in log.message and (after is None or log.timestamp >= after)]
        return min(times, default=None)

    return wait_for(f"run {run_id} to log {text!r}", first, timeout)


def secrets_on_server(url: str, auth_string: str) -> list[dict[str, Any]]:
    """Every block document the server holds, secrets revealed: what anyone with the auth string can read."""
    token = base64.b64encode(auth_string.encode()).decode()
    response = httpx.post(f"{url}/block_documents/filter", json={"include_secrets": True, "limit": 200},
                          headers={"Authorization": f"Basic {token}"}, timeout=30)  # fmt: skip
    response.raise_for_status()
    return list(response.json())


def private_keys_in(value: Any, where: str = "") -> list[str]:
    """Where a value holds a private key: PEM/OpenSSH text anywhere, or a `private_key` field with a value."""
    if isinstance(value, dict):
        found = [f"{where}.{k}" for k, v in value.items() if k == "private_key" and v]
        return found + [hit for k, v in value.items() for hit in private_keys_in(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [hit for i, v in enumerate(value) for hit in private_keys_in(v, f"{where}[{i}]")]
    return [where] if isinstance(value, str) and "PRIVATE KEY" in value else []


def unauthenticated(fleet: Fleet, netns: str, deployment: UUID, run: UUID, auth_string: str = "") -> dict[str, int]:
    """What the server answers a client in another bed host's namespace (without the auth string, or with it)."""
    env = {k: v for k, v in fleet.env("intruder").items() if k != "PREFECT_API_AUTH_STRING"}
    done = run_with_env([sys.executable, "-c", UNAUTHENTICATED, fleet.url, str(deployment), str(run), auth_string],
                        netns, env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def deployment_runs(deployment: UUID) -> int:
    with get_client(sync_client=True) as client:
        return client.count_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment])))


def in_store(store: SftpStore, run_id: UUID) -> dict[str, Any]:
    """The record and comparison of a run as the shared store holds them."""
    with store.session() as sftp:
        folder = store.full(f"{RUNS}/{run_id}")
        names = set(listing(sftp, folder))
        assert {"record.json", "report.html", "comparison.json"} <= names, names
        return {n: json.loads(read_file(sftp, f"{folder}/{n}")) for n in ("record.json", "comparison.json")}


@pytest.fixture
def fleet(fleet_server: FleetServer, testbed, tmp_path: Path) -> Iterator[Fleet]:
    pool = f"k3d-fleet-{uuid4().hex[:6]}"
    ensure_pool(pool)
    crew = Fleet(fleet_server, pool, tmp_path)
    yield crew
    crew.stop_all()


@pytest.fixture
def hook(testbed) -> Iterator[tuple[str, Received]]:
    """A webhook receiver on the bed's bridge: the server (and any worker's namespace) reaches it."""
    with receiving(host=testbed.state.bridge["ip"]) as receiver:
        yield receiver


@pytest.fixture
def store_folder(testbed) -> Iterator[tuple[Any, str]]:
    host, folder = testbed.hosts[3], f"/srv/k3d-store-{uuid4().hex[:6]}"
    yield host, folder
    testbed.ssh(host, f"rm -rf {folder}")


@needs_vllm_env
@pytest.mark.vllm
@pytest.mark.faults
def test_a_nightly_run_killed_with_its_worker_mid_bench_on_the_fleet_server_alerts_crashed_once(
    fleet: Fleet, hook, testbed, tmp_path
):
    """The production layout's server (PostgreSQL, API auth) and a worker in a bed host's namespace; the cluster
    is the stand-in profile served in that namespace, 40 ms a token, so that its real `vllm bench serve` is still
    running when the worker and the run are SIGKILLed. The server marks the run Crashed and sends one CRASHED
    alert within the bound; the next nightly run holds the cluster, passes and sends nothing."""
    with contextlib.suppress(ValueError):  # an earlier test's store on this session's database: none here
        SftpStore.delete(STORE_NAME)
    hook_url, received = hook
    data = standin_profile(tmp_path)
    data["cluster"]["name"] = cluster = f"fleet-crash-{uuid4().hex[:6]}"
    data["alerts"] = {"webhook_url": hook_url}
    data["server"] = {"grace_seconds": CRASH_GRACE_S, "heartbeat_seconds": 30}
    config = write_config(tmp_path / "crash.yaml", data)
    apply(config, fleet.pool, cluster="crash")
    netns = testbed.hosts[0].netns
    nightly = {"only": ["launch", "bench"]}

    (tmp_path / "control.json").write_text(json.dumps({"K3SIM_TOKEN_S": "0.04"}))
    fleet.start("worker-a", netns)
    dead = submit("validate/nightly-crash", **nightly)
    wait_for("the run's bench to be running", lambda: stage_label(dead) == "bench" and bench_runs_left(tmp_path),
             300)  # fmt: skip
    fleet.kill("worker-a", [dead])
    killed_at = time.monotonic()
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(dead).state.type is StateType.RUNNING  # nothing of the run could say otherwise

    ((path, message),) = wait_for("the CRASHED alert", lambda: delivered(received), CRASH_BOUND_S)
    assert time.monotonic() - killed_at <= CRASH_BOUND_S
    with get_client(sync_client=True) as client:
        crashed = client.read_flow_run(dead)
    assert crashed.state.type is StateType.CRASHED and "no heartbeat for 100 s" in str(crashed.state.message)
    assert path == "/hooks/x" and (message["verdict"], message["run_id"]) == ("CRASHED", str(dead))
    assert (message["cluster"], message["failed_stage"], message["worker"]) == (cluster, "bench", "worker-a")
    assert message["host"] and message["failure_class"] == "infrastructure"
    assert message["text"].startswith(f"k3deploy: run {crashed.name} on cluster {cluster}: CRASHED at bench")
    assert fleet.auth_string not in json.dumps(message)

    # The cluster is free for the next nightly run (a worker in the same namespace, where the dead run's ranks
    # still serve): it holds the cluster, passes, tears down, and sends nothing. Still one message in all.
    (tmp_path / "control.json").write_text(json.dumps({}))
    fleet.start("worker-b", netns)
    nxt = submit("validate/nightly-crash", **nightly)
    assert finished(nxt, timeout=600).state.type is StateType.COMPLETED
    assert any(m.startswith(f"holding cluster {cluster}") for m in run_logs(nxt)), run_logs(nxt)
    assert delivered(received) == []
    assert not list((tmp_path / "serving").glob("*/pid"))  # nothing left serving


def test_a_fleet_shares_results_and_runs_and_keeps_one_run_per_cluster_across_workers(
    fleet: Fleet, store_folder, hook, testbed, bed_nodes, tmp_path
):
    hosts = testbed.hosts
    ns_a, ns_b, ns_laptop = hosts[0].netns, hosts[2].netns, hosts[1].netns
    store_host, folder = store_folder
    saved = run_with_env([sys.executable, "-m", "k3deploy", "store", "set",
                          f"sftp://{store_host.user}@{store_host.ip}:{store_host.port}{folder}",
                          "--key-file", str(testbed.key), "--known-hosts", str(testbed.known_hosts)],
                         ns_laptop, fleet.env("admin"))  # fmt: skip
    assert saved.returncode == 0, saved.stderr
    assert f"shared store sftp://{store_host.user}@{store_host.ip}:{store_host.port}{folder}" in saved.stdout
    store = shared_store()
    assert store is not None and store.path == folder

    nodes_a, nodes_b = ["node0", "node1"], ["node2", "node3"]
    # Cluster a's bad nightly runs alert; a run of its silent for 100 s (3 heartbeats and a 10 s grace) is dead.
    hook_url, received = hook
    a = cluster_config(testbed, tmp_path, "fleet-a", nodes_a, alerts={"webhook_url": hook_url},
                       server={"grace_seconds": CRASH_GRACE_S})  # fmt: skip
    b = cluster_config(testbed, tmp_path, "fleet-b", nodes_b)
    apply(a, fleet.pool, cluster="fleet-a")
    label_a = cluster_label(load_config(a).cluster)
    with get_client(sync_client=True) as client:
        assert all(client.read_automations_by_name(n) for n in (crash_marker_name(label_a), crash_alert_name(label_a)))
    apply(b, fleet.pool, cluster="fleet-b")

    # What the documented set-up leaves on the server: the store's block, its key a path on the workers' hosts.
    blocks = secrets_on_server(fleet.url, fleet.auth_string)
    assert {"k3deploy-sftp-store"} <= {b["block_type"]["slug"] for b in blocks}, blocks
    assert private_keys_in([b["data"] for b in blocks]) == [] and "PRIVATE KEY" not in json.dumps(blocks)
    assert store.private_key_file == str(testbed.key.resolve()) and store.private_key is None

    # Only worker A is up: one run passes, one fails at launch (node1's server dies as it starts).
    fleet.start("worker-a", ns_a)
    passed = submit("validate/validate-fleet-a", only=["launch"])
    assert finished(passed, timeout=600).state.type is StateType.COMPLETED
    control(bed_nodes, "node1", K3SIM_STARTUP_S=600, K3SIM_DIE_AFTER_S=1, K3SIM_DIE_EXIT_CODE=0)
    failed = submit("validate/validate-fleet-a", only=["image", "launch"])
    assert finished(failed, timeout=600).state.type is StateType.FAILED
    assert in_store(store, failed)["record.json"]["failed_stage"] == "launch"
    assert [kind for kind, _ in stage_tasks(failed, "image", 1)] == ["COMPLETED"]  # named RolledBack: the run failed
    control(bed_nodes, "node1")

    # A nightly run holds cluster a; worker A is SIGKILLed with it: its hold is never released.
    gate(bed_nodes, nodes_a, closed=True)
    dead = submit("validate/nightly-fleet-a", only=["launch"])
    wait_for("the nightly run to hold cluster a", lambda: holder(a) == str(dead), 300)
    # A client on another bed host without the auth string can neither read the blocks' secrets, nor start a
    # run, nor cancel the one holding the cluster; with it, the same listing is served.
    with get_client(sync_client=True) as client:
        nightly_a = client.read_deployment_by_name("validate/nightly-fleet-a").id
    before = deployment_runs(nightly_a)
    refused = unauthenticated(fleet, ns_laptop, nightly_a, dead)
    assert refused == {"list blocks with secrets": 401, "create a flow run": 401, "cancel a flow run": 401}, refused
    assert unauthenticated(fleet, ns_laptop, nightly_a, dead, fleet.auth_string) == {"list blocks with secrets": 200}
    assert deployment_runs(nightly_a) == before
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(dead).state.type is StateType.RUNNING
    # Worker B (its own disk: no results, no runs) is up before the kill, so the Retry below asks for the
    # cluster well inside the dead hold's lease (a cold start after it could find the slot already freed).
    fleet.start("worker-b", ns_b)
    wait_for("the nightly run to be in launch", lambda: stage_label(dead) == "launch", 300)  # its gated start-up
    fleet.kill("worker-a", [dead])
    killed_at = time.monotonic()
    gate(bed_nodes, nodes_a, closed=False)

    # Worker B picks up the UI's Retry of the failed run.
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(failed, AwaitingRetry(message="Retry from the UI"), force=True)
    retried = finished(failed, timeout=900)
    assert retried.state.type is StateType.COMPLETED, retried.state
    assert retried.run_count == 2
    # it waited for the dead run's hold and had the cluster within the stated bound: taken over by the
    # waiter itself (it logs whose hold) or freed first by this server's lease repossessor, whichever came first
    seen = log_time(failed, "waiting for it")
    held = log_time(failed, "holding cluster", after=seen)  # the retried run's hold, not its first run's
    assert (held - seen).total_seconds() <= takeover_bound_s(BEAT_S) + LOG_SLACK_S
    took_over = [m for m in run_logs(failed) if "taking over the hold" in m]
    assert all(f"({dead})" in m for m in took_over), took_over
    # the image stage passed on A and was not run again on B: its task run came from the shared store's result
    tasks = stage_tasks(failed, "image", 2)
    assert [kind for kind, _ in tasks] == ["COMPLETED"] * 2 and tasks[-1][1] == "Cached", tasks
    stages = subflows(failed)
    assert len(stages["image"]) == 1 and stages["image"][0].run_count == 1
    assert len(stages["launch"]) == 2 and stages["launch"][-1].state.is_completed()
    assert not list((fleet.tmp / "worker-b" / "prefect" / "storage").glob("k3deploy-stage-*"))
    # judged on B against the run A made (B's runs store had it only through the shared store)
    shared = in_store(store, failed)
    assert shared["record.json"]["verdict"] == "pass"
    assert str(passed) in shared["comparison.json"]["history_runs"]
    assert (fleet.runs_dir("worker-b") / str(passed) / "record.json").is_file()

    # Both workers up: the two clusters' nightly runs hold their clusters at once; a second run on a waits.
    fleet.start("worker-a", ns_a)
    gate(bed_nodes, nodes_a + nodes_b, closed=True)
    night_a, night_b = submit("validate/nightly-fleet-a", only=["launch"]), submit("validate/nightly-fleet-b",
                                                                                  only=["launch"])  # fmt: skip
    wait_for("both clusters held", lambda: (holder(a), holder(b)) == (str(night_a), str(night_b)), 300)
    second_a = submit("validate/validate-fleet-a", only=["launch"])
    assert f"({night_a})" in logged(second_a, "waiting for it", timeout=300)
    gate(bed_nodes, nodes_b, closed=False)
    assert finished(night_b, timeout=600).state.type is StateType.COMPLETED
    assert holder(a) == str(night_a)
    gate(bed_nodes, nodes_a, closed=False)
    ends = [finished(r, timeout=600) for r in (night_a, second_a)]
    assert [r.state.type for r in ends] == [StateType.COMPLETED] * 2
    released = max(r.end_time for rs in subflows(night_a).values() for r in rs)  # the hold ends with its stages
    assert all(r.start_time >= released for r in subflows(second_a).get("launch", []))

    # A laptop with the server's URL only lists and compares the runs of both workers.
    laptop = fleet.env("laptop")
    listed = run_with_env([sys.executable, "-m", "k3deploy", "runs"], ns_laptop, laptop)
    assert listed.returncode == 0, listed.stderr
    for run_id in (passed, failed, night_a, night_b, second_a):
        assert str(run_id)[:8] in listed.stdout, (run_id, listed.stdout)
    compared = run_with_env([sys.executable, "-m", "k3deploy", "report", str(second_a), "--compare", "--format",
                             "json"], ns_laptop, laptop)  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    history = json.loads(compared.stdout)["history_runs"]
    assert {str(passed), str(failed), str(night_a)} <= set(history)  # made on A, on B, on either
    assert str(night_b) not in history  # another cluster: another config family
    assert "runs store:" in compared.stderr and store.where() in compared.stderr

    # The server marked the killed nightly run Crashed once its heartbeats stopped and sent one CRASHED alert,
    # within the bound (meanwhile everything above ran); the runs that ended normally sent none.
    left_s = max(1.0, killed_at + CRASH_BOUND_S - time.monotonic())
    ((_, message),) = wait_for("the dead run's CRASHED alert", lambda: delivered(received), timeout=left_s)
    with get_client(sync_client=True) as client:
        crashed = client.read_flow_run(dead)
    assert crashed.state.type is StateType.CRASHED and "no heartbeat for 100 s" in str(crashed.state.message)
    assert (message["verdict"], message["run_id"], message["cluster"]) == ("CRASHED", str(dead), label_a)
    assert (message["failed_stage"], message["worker"]) == ("launch", "worker-a") and message["host"]
    assert message["text"].startswith(f"k3deploy: run {crashed.name} on cluster {label_a}: CRASHED at launch")
    assert fleet.auth_string not in json.dumps(message)
