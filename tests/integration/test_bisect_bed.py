"""The bisect's image dimension on the test bed: two stand-in image tags, one of which fails smoke.

Real sshd hosts, the bed's registry and Podman engines, the local hub, a real Prefect server. The second
tag is the stand-in built again with K3SIM_NO_TOOL_PARSER in its environment: wherever it runs, a request
with tools gets vLLM's own refusal, as from a vLLM built without the tool parser the flags name.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.flow_engine import run_flow
from prefect.states import AwaitingRetry

from k3deploy.core.errors import ValidateFailed
from k3deploy.core.paths import runs_dir
from k3deploy.flows.bisect import bisect
from k3deploy.flows.validate import validate
from k3deploy.localhub import HubServer, publish
from testbed.standin import image as standin_image
from tests.bedconfig import bed_transports, write_config
from tests.checkpoints import checkpoint_files
from tests.launchbed import launch_data, ours

pytestmark = [pytest.mark.bisect, pytest.mark.e2e, pytest.mark.testbed, pytest.mark.prefect,
              pytest.mark.usefixtures("runs_dir")]  # fmt: skip
REPO = "k3test/bisect"
ON_BED = ["preflight", "models", "comm", "image", "launch", "smoke"]  # the stand-in image has no bench tool


@pytest.fixture(scope="module")
def hub(testbed, tmp_path_factory) -> Iterator[HubServer]:
    with HubServer(tmp_path_factory.mktemp("hub"), host=testbed.state.bridge["ip"]) as server:
        publish(server.root, REPO, checkpoint_files(5))
        yield server
    for transport in bed_transports(testbed).values():
        transport.run(f"rm -rf /srv/models/{REPO.split('/')[1]}", 60).check()
        transport.close()


def config(bed, hub: HubServer, tmp_path: Path, **changes: Any) -> str:
    data = launch_data(
        bed, models__hub="huggingface", models__hub_endpoint=hub.url, models__target={"repo": REPO}, **changes
    )
    return write_config(tmp_path / f"deploy-{random.randrange(10**9)}.yaml", data)


def test_of_two_image_tags_bisect_names_the_image_that_fails_smoke(prefect_server, testbed, bed_nodes, hub, tmp_path):
    repository = testbed.image_ref_by_digest.split("@")[0]
    broken = standin_image.build_and_push(
        f"{repository}:no-tool-parser", Path(testbed.state.state_dir), env={"K3SIM_NO_TOOL_PARSER": "1"}
    )
    assert broken.digest != testbed.image_digest
    good_state = validate(config=config(testbed, hub, tmp_path), only=ON_BED, return_state=True)
    assert good_state.is_completed(), good_state.message
    bad_config = config(testbed, hub, tmp_path, image__ref=f"{repository}:no-tool-parser", image__digest=broken.digest)
    bad_state = validate(config=bad_config, only=ON_BED, return_state=True)
    with pytest.raises(ValidateFailed, match="validate failed at smoke"):
        bad_state.result()
    bad_id = str(bad_state.state_details.flow_run_id)
    bad_record = json.loads((runs_dir() / bad_id / "record.json").read_text())

    # the config given supplies the SSH key, which the records hold as null
    result = bisect(run=bad_id, config=bad_config)
    document = json.loads(Path(result["record"]).read_text())
    assert [s["name"] for s in document["suspects"]] == ["image"]
    image = document["suspects"][0]
    assert image["bad"] == {"image.ref": f"{repository}:no-tool-parser", "image.digest": broken.digest}
    assert image["good"] == {"image.ref": f"{repository}:1", "image.digest": testbed.image_digest}
    assert (result["verdict"], result["culprits"]) == ("culprit", ["image"])
    assert document["outcome"]["failure_class"] == bad_record["failure"]["failure_class"]
    assert document["target"] == {"kind": "failure", "key": "smoke", "stage": "smoke", "higher_is_better": None,
                                  "good": None, "bad": None,
                                  "failure_class": bad_record["failure"]["failure_class"]}  # fmt: skip
    experiments = [(e["name"], e["reproduces"], e["failed_stage"]) for e in document["experiments"]]
    assert experiments == [("bad end", True, "smoke"), ("good end", False, None)]
    assert result["fix_verified"] and document["fix"]["experiment"] == "good end"  # every stage the bad run planned
    good_id = str(good_state.state_details.flow_run_id)
    for e in document["experiments"]:  # models, comm and image reused; each end's image from its own run
        reused = {s["stage"]: s["reused_from"] for s in e["stages"] if s["reused_from"]}
        assert set(reused) == {"models", "comm", "image"} and set(reused.values()) <= {good_id, bad_id}
        assert reused["image"] == (bad_id if e["name"] == "bad end" else good_id)
    assert "auto" in json.dumps(document["experiments"][0]["failure"])  # vLLM's refusal, as evidence
    assert not any(ours(bed_nodes).values())  # every experiment torn down

    # The UI's Retry of the bisect's flow run takes up its record: no experiment is run again.
    bisect_id = document["bisect_id"]
    before = stage_runs(bisect_id)
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(bisect_id, AwaitingRetry(message="Retry from the test"), force=True)
        flow_run = client.read_flow_run(bisect_id)
    retried = run_flow(bisect, flow_run=flow_run, return_type="state")
    assert retried.is_completed(), retried.message
    again = json.loads(Path(result["record"]).read_text())
    assert again["experiments"] == document["experiments"] and again["outcome"] == document["outcome"]
    after = stage_runs(bisect_id)
    assert after.count("launch") == before.count("launch") == 2
    assert after.count("preflight") == before.count("preflight") + 1  # host keys are checked on every run


def stage_runs(parent_id: str) -> list[str]:
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent_id]))
        )
        return [client.read_flow(r.flow_id).name for r in runs]
