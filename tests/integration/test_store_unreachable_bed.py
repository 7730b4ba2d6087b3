"""The fleet's shared store unreachable at a Retry (issue 48): by `store.on_unreachable`, the Retry stops at
preflight naming the store (`fail`), or runs on this worker's results and history and says the history is partial
(`local`: INCONCLUSIVE, never PASS); once the store is back, the next run's record reaches it, with the run made
while it was away.

The store is a real sshd (bed host 3, which the 2-node cluster does not use); it is made unreachable by refusing its
port in that host's network namespace (iptables REJECT: connection refused), and brought back by removing the rule.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any
from uuid import uuid4

import pytest
from prefect import get_client
from prefect.flow_engine import run_flow
from prefect.states import AwaitingRetry

from k3deploy.blocks.store import RUNS, STORE_NAME, SftpStore
from k3deploy.cli.store import store_from
from k3deploy.core.paths import runs_dir
from k3deploy.flows.validate import validate
from k3deploy.records.record import read_record
from tests.bedconfig import bed_config, write_config

pytestmark = [pytest.mark.testbed, pytest.mark.prefect, pytest.mark.preflight, pytest.mark.faults]


@pytest.fixture
def store(prefect_server, testbed) -> Iterator[SftpStore]:
    host, folder = testbed.hosts[3], f"/srv/k3d-store-{uuid4().hex[:6]}"
    made = store_from(f"sftp://{host.user}@{host.ip}:{host.port}{folder}", testbed.key, testbed.known_hosts)
    made.save(STORE_NAME, overwrite=True)
    try:
        yield made
    finally:  # the session's server is shared: later tests keep their runs on their own disk
        refuse(testbed, on=False)
        SftpStore.delete(STORE_NAME)
        testbed.ssh(host, f"rm -rf {folder}")


def refuse(testbed: Any, on: bool) -> None:
    """The store host's sshd port refused (on) or served again (off), in its own network namespace."""
    host = testbed.hosts[3]
    rule = ["INPUT", "-p", "tcp", "--dport", str(host.port), "-j", "REJECT", "--reject-with", "tcp-reset"]
    base = ["ip", "netns", "exec", host.netns, "iptables"]
    present = subprocess.run([*base, "-C", *rule], capture_output=True).returncode == 0
    if on and not present:
        subprocess.run([*base, "-A", *rule], check=True)
    elif not on and present:
        subprocess.run([*base, "-D", *rule], check=True)


def retry(run_id: Any) -> Any:
    """The UI's Retry of a finished run: the same flow run, AwaitingRetry, run again here."""
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, AwaitingRetry(message="Retry from the test"), force=True)
        flow_run = client.read_flow_run(run_id)
    return run_flow(validate, flow_run=flow_run, return_type="state")


def in_store(store: SftpStore) -> set[str]:
    with store.session() as sftp:
        return set(sftp.listdir(store.full(RUNS)))


def test_a_retry_without_its_store_stops_naming_it_or_goes_on_inconclusive_and_the_store_gets_it_back(
    store, testbed, tmp_path
):
    repository = testbed.image_ref_by_digest.split("@")[0]
    data = bed_config(testbed, hosts=2, image__ref=f"{repository}:1", image__digest=testbed.image_digest)
    path = tmp_path / "bed.yaml"
    config = write_config(path, data | {"store": {"on_unreachable": "fail"}})
    first = validate(config=config, only=("image",), return_state=True)  # the store answers: shared
    assert first.is_completed(), first.message
    first_id = str(first.state_details.flow_run_id)
    assert first_id in in_store(store)

    refuse(testbed, on=True)
    # fail: preflight names the store, no other stage runs
    failed = validate(config=config, only=("image",), return_state=True)
    assert failed.is_failed()
    run_id = failed.state_details.flow_run_id
    record = read_record(str(run_id))
    stages = {s.stage: s for s in record.stages}
    assert record.verdict == "fail" and record.failed_stage == "preflight" and stages["image"].verdict == "skipped"
    (finding,) = [f for f in stages["preflight"].findings if not f.ok]
    assert finding.subject == f"shared store {store.where()}" and "store.on_unreachable: fail" in finding.detail
    assert record.failure is not None and record.failure.failure_class == "infrastructure"
    again = retry(run_id)  # the same on a Retry while the store is away
    assert again.is_failed() and read_record(str(run_id)).failed_stage == "preflight"

    # local: the Retry runs on this worker's results; its history is partial, so never PASS
    write_config(path, data | {"store": {"on_unreachable": "local"}})
    local = retry(run_id)
    assert local.is_completed(), local.message
    record = read_record(str(run_id))
    assert record.verdict == "pass"
    comparison = (runs_dir() / str(run_id) / "comparison.json").read_text()
    assert '"verdict": "INCONCLUSIVE"' in comparison and "history incomplete: the shared store is unreachable" in (
        comparison)  # fmt: skip
    assert store.where() in comparison
    preflight = next(s for s in record.stages if s.stage == "preflight")
    assert any("store.on_unreachable: local" in f.detail for f in preflight.findings)

    # the store back: the next run's record reaches it, and the run made while it was away
    refuse(testbed, on=False)
    assert str(run_id) not in in_store(store)
    later = validate(config=config, only=("image",), return_state=True)
    assert later.is_completed(), later.message
    assert {str(later.state_details.flow_run_id), str(run_id), first_id} <= in_store(store)
