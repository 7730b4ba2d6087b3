from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# Property tests are judged by what they find, never by how fast a loaded CI machine runs one example.
settings.register_profile("k3deploy", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("k3deploy")

IDLE_SERVICES = ("SCHEDULER", "LATE_RUNS", "PAUSE_EXPIRATIONS", "FOREMAN", "TRIGGERS", "EVENT_LOGGER",
                 "CLEANUP_RECONCILER", "DB_VACUUM")  # fmt: skip

pytest_plugins = [
    "testbed.pytest_plugin",
    "tests.launchbed",
    "tests.prefect_worker",
    "tests.postgres",
    "tests.budget",
    "tests.sharing",
]


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real (temporary) Prefect server for the session; results persist under a fresh folder."""
    import prefect.settings as prefect_settings
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    storage = tmp_path_factory.mktemp("prefect-results")
    quiet: dict[Any, Any] = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None, PREFECT_SERVER_ANALYTICS_ENABLED: False}
    # The server's loops no test uses (schedules, late runs, pauses, worker liveness, automations, clean-ups) stay
    # off: idle, they took a tenth of a core per server, the whole run long (docs/BENCHMARKS.md).
    for service in IDLE_SERVICES:
        quiet[getattr(prefect_settings, f"PREFECT_SERVER_SERVICES_{service}_ENABLED")] = False
    with (
        temporary_settings({**quiet, PREFECT_LOCAL_STORAGE_PATH: storage}),
        prefect_test_harness(server_startup_timeout=120),
    ):
        yield storage
