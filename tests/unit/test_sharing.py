"""How two pytest-xdist workers share the machine: which tests go together."""

from __future__ import annotations

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


def test_a_module_on_the_stand_ins_ports_goes_with_the_others_on_them_unless_it_uses_the_bed():
    assert group_of("/r/tests/integration/test_prefect_operations.py", False, standin=True) == STANDIN
    assert group_of("/r/tests/integration/test_prefect_operations.py", True, standin=True) == BED
