from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests are judged by what they find, never by how fast a loaded CI machine runs one example.
settings.register_profile("k3deploy", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("k3deploy")

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
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    storage = tmp_path_factory.mktemp("prefect-results")
    quiet = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None, PREFECT_SERVER_ANALYTICS_ENABLED: False}
    with (
        temporary_settings({**quiet, PREFECT_LOCAL_STORAGE_PATH: storage}),
        prefect_test_harness(server_startup_timeout=120),
    ):
        yield storage
