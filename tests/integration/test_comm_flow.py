"""The comm flow on the test bed: a healthy pass is reused on a rerun, a failure is named and never reused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from k3deploy.core.errors import CommStageFailed
from k3deploy.flows.comm import comm
from tests.bedconfig import bed_config, write_config
from tests.prefect_runs import task_states

pytestmark = [pytest.mark.comm, pytest.mark.testbed, pytest.mark.prefect]


def config(bed, tmp_path: Path) -> str:
    return write_config(tmp_path / f"deploy-{random.randrange(10**9)}.yaml", bed_config(bed))


def task_state(flow_state) -> str:
    return task_states(flow_state)["comm checks"]


def test_healthy_bed_passes_and_a_rerun_reuses_the_pass_unless_asked_fresh(prefect_server, testbed, tmp_path):
    path = config(testbed, tmp_path)
    first = comm(config=path, fresh=True, return_state=True)
    assert first.is_completed() and task_state(first) == "Completed"
    summary = first.result().summary
    assert summary.startswith("comm OK: ") and summary.endswith(", 0 failed")
    again = comm(config=path, return_state=True)
    assert task_state(again) == "Cached"
    assert task_state(comm(config=path, fresh=True, return_state=True)) == "Completed"


def test_a_failure_names_node_and_npu_and_is_not_reused(prefect_server, testbed, testbed_faults, tmp_path):
    path = config(testbed, tmp_path)
    testbed_faults.set("node1", {"link_down": [3]})
    with pytest.raises(CommStageFailed) as failed:
        comm(config=path, fresh=True)
    assert "node1 NPU 3: link" in str(failed.value)
    assert {f.subject for f in failed.value.result.failures if f.check == "link"} == {"node1 NPU 3"}
    testbed_faults.clear()
    healed = comm(config=path, return_state=True)  # the failure was not cached: the checks run again
    assert healed.is_completed() and task_state(healed) == "Completed"


@pytest.mark.faults
def test_a_reused_pass_still_refuses_a_node_whose_host_key_changed(prefect_server, testbed, tmp_path):
    """The hour-long reuse of a pass skips the checks, never the connection and its pinned host key."""
    pinned = tmp_path / "known_hosts"
    pinned.write_text(Path(testbed.known_hosts).read_text())
    data = bed_config(testbed)
    data["cluster"]["ssh"]["known_hosts"] = str(pinned)
    path = write_config(tmp_path / "site.yaml", data)
    assert comm(config=path, fresh=True, return_state=True).is_completed()
    node0, node2 = testbed.host("node0").ip, testbed.host("node2").ip
    lines = pinned.read_text().splitlines()
    other = next(line for line in lines if line.startswith(f"{node0} ")).split(" ", 1)[1]
    pinned.write_text("\n".join(f"{node2} {other}" if line.startswith(f"{node2} ") else line for line in lines))
    with pytest.raises(CommStageFailed) as failed:
        comm(config=path)  # not fresh: the pass of a minute ago would be reused
    assert "node2" in str(failed.value) and "host key CHANGED" in str(failed.value)
