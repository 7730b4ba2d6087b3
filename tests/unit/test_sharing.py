"""How two pytest-xdist workers share the machine: which tests go together."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.sharing import BED, LOCAL, STANDIN, group_of

pytestmark = pytest.mark.bed


@pytest.mark.parametrize(
    ("path", "uses_bed", "group"),
    [("/r/tests/integration/test_comm_bed.py", True, BED), ("/r/tests/integration/test_tune_local.py", False, LOCAL),
     ("/r/tests/unit/test_plan.py", False, None), ("/r/tests/unit/test_x.py", True, BED)],
)  # fmt: skip
def test_bed_modules_go_together_integration_ones_together_and_unit_tests_anywhere(path, uses_bed, group):
    assert group_of(path, uses_bed) == group


def test_an_integration_module_marked_anywhere_goes_to_either_worker_unless_it_uses_the_bed():
    assert group_of("/r/tests/integration/test_hub.py", False, anywhere=True) is None
    assert group_of("/r/tests/integration/test_hub.py", True, anywhere=True) == BED


def test_a_module_on_the_stand_in_is_a_group_of_its_own_unless_it_uses_the_bed():
    """The stand-in's ports are each worker's own: two stand-in modules may run at once, each on one worker."""
    operations = group_of("/r/tests/integration/test_prefect_operations.py", False, standin=True)
    alerts = group_of("/r/tests/integration/test_alerts_webhook.py", False, standin=True)
    assert operations and alerts and operations != alerts and STANDIN in operations
    assert LOCAL not in (operations, alerts)
    assert group_of("/r/tests/integration/test_prefect_operations.py", True, standin=True) == BED


def test_each_worker_has_stand_in_ports_of_its_own():
    def ports(worker: str) -> str:
        code = "from tests.standin_profile import PORT, RPC_PORT; print(PORT, RPC_PORT)"
        env = {**os.environ, "PYTEST_XDIST_WORKER": worker}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout

    assert ports("gw0") == "18300 13645\n" and ports("gw1") == "19300 14645\n"
