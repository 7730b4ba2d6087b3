"""How the suite shares this machine between two pytest-xdist workers (`-n 2` in pyproject's addopts).

The suite spends half its time waiting (on servers starting, workers polling, the bed's sshd): one core idles
while the other works, so two workers run it in a little more than half the time. What must not overlap is
the fixed resources:

* Every module that uses the test bed is in group `bed`: one worker has the bed, and
  `testbed_left_as_found` sees only its own module's doing. Every other integration module is in group
  `local` (the local profile's fixed loopback ports, its state folder, the real vLLM), but those marked
  `anywhere` (no fixed port, no shared state) and those marked `standin`: the stand-in's ports are each
  worker's own (tests/standin_profile.py), so each such module is a group of its own (its tests in order on one
  worker, its module fixtures made once). Unit tests and `anywhere` modules go to either worker. xdist hands
  out the units by their number of tests, a worker taking the next when it has two tests left: the bed to one
  worker, the local profile to the other, then the stand-in's modules and the single tests to whichever is
  nearly done.
* A test that judges figures it measures (a regression, a bisect's experiments) does not get the machine to
  itself: it makes the effect it judges far larger than what the other worker's load can add (a queue of
  requests, 20 ms a token against none), so it passes for its state, never for a quiet machine.

The groups are xdist load-scope units (a group's tests run on one worker, in their order); which test is in which
group the workers write when they collect, and the controller's scheduler reads. Without xdist (`-n 0`) none of
this does anything.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

LOCAL = "local"
BED = "bed"
STANDIN = "standin"
# Set by the controller of an xdist run for its workers: a folder of the run's own (the tests' groups, the locks).
FOLDER_ENV = "K3DEPLOY_TEST_SHARING"


def group_of(path: str, uses_bed: bool, anywhere: bool = False, standin: bool = False) -> str | None:
    """The group of a module's tests: None lets a test go to either worker (unit tests, and integration modules
    marked `anywhere`: no fixed port, no shared state); a stand-in module is a group of its own."""
    if uses_bed:
        return BED
    if standin:
        return f"{STANDIN}:{path}"
    if "/integration/" in path and not anywhere:
        return LOCAL
    return None


def groups(items: list[pytest.Item]) -> dict[str, str]:
    """Each grouped test's id and its group. A module is a bed module if any of its tests uses the bed."""
    bed_modules = {
        item.path
        for item in items
        if item.get_closest_marker("testbed") or "testbed" in getattr(item, "fixturenames", ())
    }
    found = {
        item.nodeid: group_of(str(item.path), item.path in bed_modules, item.get_closest_marker("anywhere") is not None,
                              item.get_closest_marker("standin") is not None)
        for item in items
    }  # fmt: skip
    return {nodeid: group for nodeid, group in found.items() if group}


def folder() -> Path | None:
    value = os.environ.get(FOLDER_ENV)
    return Path(value) if value else None


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):  # an xdist run's controller
        os.environ[FOLDER_ENV] = tempfile.mkdtemp(prefix="k3deploy-tests-")  # the workers it starts inherit it


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and (shared := folder()):
        shutil.rmtree(shared, ignore_errors=True)
        del os.environ[FOLDER_ENV]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the groups of every test collected
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if (shared := folder()) is None:
        return
    part = shared / f"groups.{os.getpid()}.json"
    part.write_text(json.dumps(groups(items)))
    part.replace(shared / "groups.json")  # every worker collects the same tests: whichever is last is the same


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load-scope scheduling, a scope being a group (or a single ungrouped test), read from what the
    workers collected (xdist's own `xdist_group` marks are not honoured by pytest 9.2's test ids)."""
    if (shared := folder()) is None:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        known: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.known is None:  # read once every worker has collected (scheduling starts only then)
                self.known = json.loads((shared / "groups.json").read_text())
            return self.known.get(nodeid, nodeid)

    return GroupScheduling(config, log)
