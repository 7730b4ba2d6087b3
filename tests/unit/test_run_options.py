"""The per-run choices of the UI's form applied over a config, and what a retry compares to skip a stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.blocks import parse_config
from k3deploy.blocks.loader import load_config
from k3deploy.core.errors import ConfigError
from k3deploy.flows.registry import BY_NAME
from k3deploy.flows.run_options import AS_CONFIGURED, BenchOptions, BenchWorkloads, apply_options
from k3deploy.tasks.stage_cache import stage_inputs_key
from tests.configs import site_data

pytestmark = pytest.mark.prefect
LOCAL = Path(__file__).parents[2] / "configs" / "local.yaml"


def test_as_configured_changes_nothing():
    cfg = load_config(str(LOCAL))
    assert apply_options(cfg, AS_CONFIGURED, BenchOptions()) is cfg


def test_bench_choices_and_no_draft_are_applied_and_checked_again():
    cfg = load_config(str(LOCAL))
    chosen = apply_options(cfg, "none", BenchOptions(workloads=BenchWorkloads.cold, concurrency_sweep=[1, 4]))
    assert (chosen.bench.prefix_hit, chosen.bench.concurrency_sweep, chosen.models.draft) == (False, [1, 4], None)
    assert cfg.bench.prefix_hit is True  # the saved config is left as it was


def test_a_draft_that_does_not_fit_the_config_is_a_config_error_naming_the_field():
    cfg = load_config(str(LOCAL))
    with pytest.raises(ConfigError, match=r"models\.draft\.max_model_len"):
        apply_options(cfg, "Inferact/Kimi-K3-DSpark", BenchOptions())


def test_a_known_draft_is_served_with_its_speculative_settings():
    chosen = apply_options(parse_config(site_data()), "Inferact/Kimi-K3-DSpark-Block5", BenchOptions())
    assert chosen.models.draft is not None
    assert (chosen.models.draft.kind, chosen.models.draft.num_speculative_tokens) == ("mla-block5", 5)


def test_a_stage_is_skipped_on_retry_only_while_the_sections_it_reads_are_unchanged():
    cfg = load_config(str(LOCAL))
    models, image = BY_NAME["models"], BY_NAME["image"]
    key = stage_inputs_key(models, cfg, {"download": True, "fresh": False}, "run-1")
    assert key == stage_inputs_key(models, cfg, {"download": True, "fresh": True}, "run-1")  # not models' option
    assert key != stage_inputs_key(models, cfg, {"download": False}, "run-1")
    assert key != stage_inputs_key(models, cfg, {"download": True}, "run-2")  # another run: its own results
    moved = cfg.model_copy(deep=True)
    moved.models.target.revision = "0" * 40
    assert key != stage_inputs_key(models, moved, {"download": True}, "run-1")
    assert stage_inputs_key(image, cfg, {}, "run-1") == stage_inputs_key(image, moved, {}, "run-1")
    benched = cfg.model_copy(deep=True)
    benched.bench.num_prompts = 7
    assert key == stage_inputs_key(models, benched, {"download": True}, "run-1")


def test_comm_and_image_read_only_the_serve_keys_they_use():
    cfg = load_config(str(LOCAL))
    comm, image = BY_NAME["comm"], BY_NAME["image"]
    tuned = cfg.model_copy(deep=True)
    tuned.serve.max_num_seqs = 1  # launch's flag: neither reads it, so neither runs again for it
    for stage in (comm, image):
        assert stage_inputs_key(stage, cfg, {}, "run-1") == stage_inputs_key(stage, tuned, {}, "run-1")
    moved = cfg.model_copy(deep=True)
    moved.serve.rpc_port += 1  # comm checks the port is free
    assert stage_inputs_key(comm, cfg, {}, "run-1") != stage_inputs_key(comm, moved, {}, "run-1")
    assert stage_inputs_key(image, cfg, {}, "run-1") == stage_inputs_key(image, moved, {}, "run-1")
    contained = cfg.model_copy(deep=True)
    contained.serve.runtime = "docker"  # the image stage probes an image instead of an environment
    assert stage_inputs_key(image, cfg, {}, "run-1") != stage_inputs_key(image, contained, {}, "run-1")


def _type_switches(node: object, path: str = "") -> list[str]:
    """Where a schema offers a choice of types (anyOf / oneOf): the UI's form shows those as a type switch."""
    found = [path] if isinstance(node, dict) and ({"anyOf", "oneOf"} & set(node)) else []
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, value in children:
        found += _type_switches(value, f"{path}/{key}")
    return found


@pytest.mark.parametrize(
    "name", ["nightly", "validate", "soak", "stage-models", "stage-soak", "bisect", "tune", "teardown"]
)
def test_every_run_form_has_plain_described_controls_and_no_secret(name):
    from k3deploy.deployments.definitions import deployments

    (deployment,) = [d for d in deployments(str(LOCAL)) if d.name == name]
    schema = deployment._parameter_openapi_schema.model_dump()
    assert _type_switches(schema) == []
    described = [*schema["properties"].items()]
    for definition in schema.get("definitions", {}).values():
        described += [*definition.get("properties", {}).items()]
    assert [key for key, field in described if not field.get("description")] == []
    # no secret field (a form's values are stored in plain text); the help may well say "secrets"
    assert not {key for key, _ in described} & {"private_key", "hub_token", "password", "ssh", "auth"}
    assert "writeOnly" not in str(schema) and "'format': 'password'" not in str(schema)
    assert schema["properties"]["config"]["type"] == "string"


def test_validate_form_offers_the_stages_as_a_multi_select_and_a_dropdown():
    from prefect.utilities.callables import parameter_schema

    from k3deploy.flows.validate import validate

    schema = parameter_schema(validate.fn).model_dump()
    only, start = schema["properties"]["only"], schema["properties"]["from_stage"]
    assert only["type"] == "array" and only["items"] == {"$ref": "#/definitions/StageName"} and only["default"] == []
    assert start["$ref"] == "#/definitions/StageName" and start["default"] == "preflight"
    assert schema["definitions"]["StageName"]["enum"][0] == "preflight"


@pytest.mark.parametrize(
    ("only", "start", "expected"),
    [((), "preflight", 11), (("bench",), "preflight", 2), ((), "launch", 8)],
)
def test_the_forms_defaults_mean_every_stage(only, start, expected):
    from k3deploy.flows.validate import chosen_stages

    chosen = chosen_stages(only, start)
    assert len(chosen) == expected and chosen[0].name == "preflight"


def test_the_weekly_soak_and_the_off_by_default_stages_own_deployments_ask_for_them():
    """capacity and soak do not run unless a run asks: their deployments ask (a weekly soak, the stage alone)."""
    from k3deploy.deployments.definitions import SOAK_CRON, deployments

    made = {d.name: d for d in deployments(str(LOCAL))}
    weekly = made["soak"]
    assert weekly.parameters["stages"] == {"soak": True} and "only" not in weekly.parameters
    assert [s.schedule.cron for s in weekly.schedules] == [SOAK_CRON]  # type: ignore[union-attr]
    assert made["stage-soak"].parameters["stages"] == {"soak": True}
    assert made["stage-capacity"].parameters["stages"] == {"capacity": True}
    assert "stages" not in made["stage-bench"].parameters
