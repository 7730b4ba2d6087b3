"""The Prefect UI, tried in a real browser: headless Chromium opens validate's Run form on a running server,
picks a stage in the stages multi-select, submits, and a real process worker completes the run.

The server is k3deploy's own (`k3deploy server` start, with the UI, on the port it finds free: the CI's
own server holds 4200, so this one proves the UI reaches the server it is served by). Playwright drives the
system Chromium (Debian's package); the serving side is the stand-in profile.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from PIL import Image
from prefect import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
)

from k3deploy.cli import server
from k3deploy.deployments.definitions import apply
from tests.bedconfig import write_config
from tests.prefect_runs import api_at, finished, wait_for
from tests.prefect_worker import stop_worker
from tests.standin_profile import standin_profile
from tests.vllm_env import needs_vllm_env

ARTIFACTS = Path(__file__).parents[2] / "test-artifacts"

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.standin,
    pytest.mark.prefect,
    pytest.mark.vllm,
    pytest.mark.e2e,
    needs_vllm_env,
    pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt install chromium; .ci/run installs it)"),
]
FORM_TIMEOUT_MS = 120_000  # the form renders once the UI has read the deployment and its schema from the API


@pytest.fixture
def ui_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[server.ServerInfo]:
    """`k3deploy server`'s own start (its home in this test's folder), stopped at the end."""
    monkeypatch.setenv("K3DEPLOY_HOME", str(tmp_path / "home"))
    info = server.start(lambda _: None)
    try:
        with api_at(info.url):
            yield info
    finally:
        server.stop()


@pytest.fixture
def ui_worker(ui_server: server.ServerInfo, tmp_path: Path) -> Iterator[str]:
    pool = f"k3d-ui-{uuid4().hex[:6]}"
    env = os.environ | {"PREFECT_API_URL": ui_server.url, "PREFECT_WORKER_QUERY_SECONDS": "1", "DO_NOT_TRACK": "1"}
    log = (tmp_path / "worker.log").open("w")
    command = [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--type", "process"]
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    yield pool
    stop_worker(proc)
    log.close()


def runs_of(deployment_id: UUID) -> list[UUID]:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    return [r.id for r in runs]


def stage_runs(run_id: UUID) -> list[str]:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id]))
        )
        return [client.read_flow(r.flow_id).name for r in sorted(runs, key=lambda r: r.created)]


def submit(page: Any, tries: int = 3) -> None:
    """Click Submit until the API has taken the run's creation, as a person clicks again when a click did
    nothing (seen in CI on a busy machine) or the page said the server was busy: Prefect answers 503 when its
    SQLite database stays locked, and the creation is then rolled back. So at most one run is created; the test
    still fails if no click gets it created."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(tries):
        try:
            creation = lambda r: r.request.method == "POST" and r.url.endswith("/create_flow_run")  # noqa: E731
            with page.expect_response(creation, timeout=30_000) as answer:
                page.get_by_role("button", name="Submit").click()
            if answer.value.status != 503:
                return
        except PlaywrightTimeout:
            continue


def test_validate_run_form_in_chromium_starts_a_run_that_a_worker_completes(ui_server, ui_worker, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    config = write_config(tmp_path / "site.yaml", standin_profile(tmp_path))
    ids = apply(config, ui_worker, runs=tmp_path / "runs")
    # the UI's pages call the API the page was served by, whatever port the server found free
    assert httpx.get(f"{ui_server.ui}/ui-settings", timeout=30).json()["api_url"] == ui_server.url
    form_url = f"{ui_server.ui}/deployments/deployment/{ids['validate']}/run"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 2000})
        # what the page asked of the API and what it said on its console, for whoever reads a failure
        calls: list[str] = []
        page.on("response", lambda r: "/api/" in r.url and calls.append(f"{r.request.method} {r.url} {r.status}"))
        page.on("console", lambda m: m.type in ("error", "warning") and calls.append(f"console {m.type}: {m.text}"))
        # every wait of the page's, not only the form's, bounded for a busy machine (Playwright's own are 30/5 s)
        page.set_default_timeout(FORM_TIMEOUT_MS)
        page.set_default_navigation_timeout(FORM_TIMEOUT_MS)
        expect.set_options(timeout=FORM_TIMEOUT_MS)
        page.goto(form_url)
        page.get_by_text("keep_serving").first.wait_for(timeout=FORM_TIMEOUT_MS)

        # Plain controls: no type switch anywhere; the stages a multi-select, from_stage a dropdown at preflight.
        assert page.locator(".schema-form-property-any-of").count() == 0
        only = page.locator(".schema-form-property", has_text="only (Optional)").first
        stages = only.locator("button.p-select-button__control")
        assert stages.inner_text().strip() == "No items selected" and stages.get_attribute("modelvalue") == ""
        start = page.locator(".schema-form-property", has_text="from_stage (Optional)").first
        assert start.locator("button.p-select-button__control").inner_text().strip() == "preflight"
        for text in ("none chosen: every stage", "preflight: every stage"):
            assert page.get_by_text(text).count() == 1

        stages.focus()
        page.keyboard.press("ArrowDown")  # opens the list of stages, each with its checkbox
        options = page.get_by_role("option")
        options.first.wait_for(timeout=FORM_TIMEOUT_MS)
        assert options.all_inner_texts() == ["preflight", "models", "comm", "image", "launch", "smoke", "conformance",
                                             "bench", "capacity", "soak", "accuracy"]  # fmt: skip
        page.get_by_role("option", name="launch").click()
        expect(page.get_by_role("option", name="launch")).to_have_class(re.compile("p-select-option--selected"))
        page.keyboard.press("Escape")
        if options.first.is_visible():  # the click can leave focus where Escape does not reach: close it as a person
            page.get_by_text("Parameters", exact=True).click()
        expect(options.first).to_be_hidden()  # an open list would take the Submit click below for itself
        expect(stages).to_have_attribute("modelvalue", "launch", timeout=FORM_TIMEOUT_MS)  # the form's value
        # kept for a person (test-artifacts/, gitignored): the filled form as the user sees it
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "prefect-ui-validate-form.png"
        shot.unlink(missing_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        assert len(Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20) or []) > 20  # drawn, not blank

        submitted = len(calls)
        submit(page)
        # what the click must do is make a flow run on the server (the page it then shows is the UI's affair);
        # if it does not, the page as it stands is kept beside the form's picture for whoever reads the failure
        try:
            (run_id,) = wait_for("the submitted run", lambda: runs_of(ids["validate"]), timeout=FORM_TIMEOUT_MS / 1000)
        except AssertionError as timed_out:
            page.screenshot(path=str(ARTIFACTS / "prefect-ui-after-submit.png"), full_page=True)
            said = f"the page at {page.url} made these calls after Submit: {calls[submitted:]}"
            raise AssertionError(f"{timed_out}; {said}") from None
        browser.close()

    run = finished(run_id, timeout=600)
    assert run.state is not None and run.state.is_completed(), run.state
    assert run.parameters["only"] == ["launch"] and run.parameters["config"] == config
    assert stage_runs(run_id) == ["preflight", "launch", "teardown"]
    assert (tmp_path / "runs" / str(run_id) / "record.json").is_file()
