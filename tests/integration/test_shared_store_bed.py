"""The fleet's shared store against a real sshd (a bed host): pinned host key, whole-file writes, runs pulled
only when newer, and the key never shown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest
from prefect import flow, task
from pydantic import SecretStr

from k3deploy.blocks.store import STORE_NAME, SftpStore, StoreError
from k3deploy.cli.store import store_from
from k3deploy.tasks.transport.sftp_store import pull_files, push_folder, shared_store

pytestmark = [pytest.mark.testbed, pytest.mark.prefect]


@pytest.fixture
def store(testbed) -> Iterator[SftpStore]:
    host, folder = testbed.hosts[3], f"/srv/k3d-store-{uuid4().hex[:6]}"
    yield store_from(f"sftp://{host.user}@{host.ip}:{host.port}{folder}", testbed.key, testbed.known_hosts)
    testbed.ssh(host, f"rm -rf {folder}")


def test_files_round_trip_and_a_missing_one_is_not_found(store):
    assert store.write_path("results/k3deploy-stage-x", b"\x00result") == "results/k3deploy-stage-x"
    assert store.read_path("results/k3deploy-stage-x") == b"\x00result"
    with pytest.raises(FileNotFoundError, match="not in the store"):
        store.read_path("results/none")  # Prefect's result store reads this as a cache miss
    with pytest.raises(StoreError, match="not a path inside the store"):
        store.write_path("../escape", b"x")


def test_a_host_showing_another_key_is_refused(store, testbed):
    other = testbed.hosts[0]
    wrong = store_from(f"sftp://root@{other.ip}:{other.port}/srv", testbed.key, testbed.known_hosts).host_key
    with pytest.raises(StoreError, match="showed another key than the pinned one") as refused:
        store.model_copy(update={"host_key": wrong}).read_path("anything")
    assert testbed.key.read_text() not in str(refused.value)


def test_a_host_not_in_known_hosts_is_refused_before_any_connection(testbed, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    host = testbed.hosts[3]
    with pytest.raises(Exception, match=r"is not in .*known_hosts: add its host key there first"):
        store_from(f"sftp://root@{host.ip}:{host.port}/srv/x", testbed.key, known)


def test_runs_are_pushed_whole_and_pulled_only_when_newer(store, tmp_path):
    mine, laptop = tmp_path / "worker" / "run-1", tmp_path / "laptop"
    (mine / "logs").mkdir(parents=True)
    (mine / "record.json").write_text(json.dumps({"verdict": "fail"}))
    (mine / "logs" / "node0.log").write_text("started\n")
    assert push_folder(store, mine, "runs/run-1") == 2
    assert pull_files(store, "runs", ("record.json", "report.html"), laptop) == ["run-1/record.json"]
    assert json.loads((laptop / "run-1" / "record.json").read_text()) == {"verdict": "fail"}
    assert not (laptop / "run-1" / "logs").exists()  # records and reports only
    assert pull_files(store, "runs", ("record.json",), laptop) == []  # nothing newer

    # a Retry on another worker rewrites the record: it comes again; a newer local copy is left alone
    (mine / "record.json").write_text(json.dumps({"verdict": "pass"}))
    os.utime(mine / "record.json", (2_000_000_000, 2_000_000_000))
    push_folder(store, mine, "runs/run-1")
    assert pull_files(store, "runs", ("record.json",), laptop) == ["run-1/record.json"]
    assert json.loads((laptop / "run-1" / "record.json").read_text()) == {"verdict": "pass"}
    newer = laptop / "run-1" / "record.json"
    newer.write_text(json.dumps({"verdict": "local"}))
    os.utime(newer, (2_100_000_000, 2_100_000_000))
    assert pull_files(store, "runs", ("record.json",), laptop) == []
    assert json.loads(newer.read_text()) == {"verdict": "local"}


def test_the_key_is_never_shown(store, testbed):
    saved = store.model_copy(update={"private_key_file": None, "private_key": SecretStr(testbed.key.read_text())})
    secret = testbed.key.read_text()
    for kept in (store, saved):
        for text in (repr(kept), str(kept), kept.where(), json.dumps(kept.model_dump(mode="json"))):
            assert secret not in text


def test_saved_on_the_server_by_default_it_holds_the_key_s_path_not_the_key(prefect_server, store, testbed):
    """What whoever can read the server's blocks (secrets revealed) learns of the store: where its key lies."""
    from prefect import get_client

    store.save(STORE_NAME, overwrite=True)
    try:
        with get_client(sync_client=True) as client:
            document = client.read_block_document_by_name(STORE_NAME, "k3deploy-sftp-store", include_secrets=True)
        loaded = shared_store()  # as a worker loads it: the key read from that path on its own host
        assert loaded is not None and loaded.write_path("probe", b"k3deploy") == "probe"
        assert loaded.read_path("probe") == b"k3deploy"
    finally:
        SftpStore.delete(STORE_NAME)
    assert document.data["private_key_file"] == str(testbed.key.resolve())
    assert not document.data.get("private_key") and "PRIVATE KEY" not in json.dumps(document.data)


def test_prefect_keeps_a_task_result_there_and_a_second_run_reads_it_back(prefect_server, store, tmp_path):
    """What a Retry on another worker relies on: the cache record is in the store, not on this host's disk."""
    store.save(STORE_NAME, overwrite=True)
    try:
        ran_twice(store, prefect_server)
    finally:  # the session's server is shared: later tests keep their runs on their own disk
        SftpStore.delete(STORE_NAME)
    assert shared_store() is None


def ran_twice(store: SftpStore, local_storage: Path) -> None:
    key = f"k3deploy-stage-test-{uuid4().hex[:6]}"
    calls: list[int] = []

    @task(cache_key_fn=lambda *_: key, persist_result=True, result_storage=shared_store())
    def stage() -> dict[str, int]:
        calls.append(1)
        return {"answer": 42}

    @flow
    def twice() -> list[str]:
        return [stage(return_state=True).name for _ in range(2)]

    assert twice() == ["Completed", "Cached"] and calls == [1]
    assert store.read_path(key)  # the record, in the store
    assert not list(local_storage.rglob(f"{key}*"))  # and not in this host's result storage


def test_a_bisect_and_a_tune_made_on_one_worker_are_listed_and_opened_by_the_cli_on_another_host(
    prefect_server, store, tmp_path
):
    """Worker A writes a bisect's and a tune's records (as their flows do) and shares their folders with the
    function the flows call; `k3deploy runs` and `k3deploy report ID` with another runs store (another host's)
    pull them from the store, list them by kind and open them."""
    from prefect.logging import get_logger
    from prefect.settings import PREFECT_API_URL

    from k3deploy.records.bisect_record import BisectRecord, write_bisect
    from k3deploy.records.bisect_search import Outcome, Target
    from k3deploy.records.run_report import share
    from k3deploy.records.tune_record import TuneRecord, write_tune

    worker_a, third = tmp_path / "worker-a", tmp_path / "third-host"
    when = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    bisect_id, tune_id = f"bisect-{uuid4().hex[:8]}", f"tune-{uuid4().hex[:8]}"
    target = Target(kind="failure", key="smoke", stage="smoke", failure_class="engine")
    write_bisect(BisectRecord(bisect_id=bisect_id, bad_run="run-bad", good_run="run-good", started_at=when,
                              ended_at=when, max_experiments=4, target=target, suspects=[],
                              outcome=Outcome(verdict="culprit", culprits=["image"], reason="it alone")),
                 worker_a)  # fmt: skip
    write_tune(TuneRecord(tune_id=tune_id, started_at=when, ended_at=when, config_fingerprint="f00d", config={},
                          matrix={}, nodes=2), worker_a)  # fmt: skip
    store.save(STORE_NAME, overwrite=True)
    try:
        os.environ["K3DEPLOY_RUNS_DIR"] = str(worker_a)
        for folder in (bisect_id, tune_id):
            share(folder, get_logger("test"))
        env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "K3DEPLOY_RUNS_DIR": str(third),
               "COLUMNS": "200"}  # fmt: skip
        listed = k3deploy("runs", env=env)
        opened = {ident: k3deploy("report", ident, env=env) for ident in (bisect_id, tune_id)}
    finally:
        os.environ.pop("K3DEPLOY_RUNS_DIR", None)
        SftpStore.delete(STORE_NAME)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[2].strip(): line for line in listed.stdout.splitlines() if line.count("│") > 4}
    assert "bisect" in rows[bisect_id] and "culprit" in rows[bisect_id] and "run run-bad" in rows[bisect_id]
    assert "tune" in rows[tune_id] and "0/0 cells passed" in rows[tune_id]
    assert opened[bisect_id].returncode == 0 and f"bisect {bisect_id}" in opened[bisect_id].stdout
    assert "bisect of run run-bad against its last pass run-good" in opened[bisect_id].stdout
    assert opened[tune_id].returncode == 0 and f"tune {tune_id}" in opened[tune_id].stdout
    assert (third / bisect_id / "bisect.json").exists() and (third / tune_id / "tune.json").exists()


def k3deploy(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "k3deploy", *args], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip
