"""How two pytest-xdist workers share the machine: which tests go together, and a module that measures speed
having the machine to itself (real flock locks between real processes)."""

from __future__ import annotations

import fcntl
import select
import subprocess
import sys
import textwrap

import pytest

from tests.prefect_runs import wait_for
from tests.sharing import BED, LOCAL, group_of, machine

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


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.sharing import machine
    paths = (Path(sys.argv[1]), Path(sys.argv[2]))
    with machine(sys.argv[3] == "alone", paths):
        print("holding", flush=True)
        sys.stdin.readline()
    """
)


def holder(tmp_path, kind: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "turnstile"), str(tmp_path / "machine"), kind],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_shared_holders_run_together_and_an_alone_one_waits_for_them_and_holds_off_new_ones(tmp_path):
    first, second = holder(tmp_path, "shared"), holder(tmp_path, "shared")
    procs = [first, second]
    try:
        assert first.stdout.readline() == "holding\n" and second.stdout.readline() == "holding\n"  # together
        alone = holder(tmp_path, "alone")
        procs.append(alone)
        # the alone one takes the turnstile, then waits on the machine: a third shared holder waits behind it
        wait_for("the alone holder at the turnstile", lambda: turnstile_taken(tmp_path), timeout=30)
        late = holder(tmp_path, "shared")
        procs.append(late)
        first.communicate("\n", timeout=30)
        assert not said_anything(alone) and not said_anything(late)  # one shared holder is still there
        second.communicate("\n", timeout=30)
        assert alone.stdout.readline() == "holding\n"  # both shared holders gone: it has the machine
        assert not said_anything(late)
        alone.communicate("\n", timeout=30)
        assert late.stdout.readline() == "holding\n"
        late.communicate("\n", timeout=30)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


def said_anything(proc: subprocess.Popen[str]) -> bool:
    """Whether the holder has written a line (a look, not a wait: it cannot hold the lock now)."""
    return bool(select.select([proc.stdout], [], [], 0)[0])


def turnstile_taken(tmp_path) -> bool:
    """Whether someone holds the turnstile (a try that fails without waiting)."""
    with open(tmp_path / "turnstile", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_outside_xdist_nothing_is_locked():
    with machine(True, None), machine(False, None):
        pass
