"""Bad input is refused before anything touches a node, with an error naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from k3deploy.blocks import load_config, parse_config
from k3deploy.blocks.source import is_yaml_path
from k3deploy.core.errors import ConfigError
from tests.configs import REFERENCE, site_data, with_changes

pytestmark = pytest.mark.config


def problems_of(data, **environ) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_config(data, environ=environ)
    return dict(info.value.problems)


def four_nodes(**override):
    return [{"name": f"node{i}", "address": f"192.0.2.{10 + i}", "nic": "eth0", **override} for i in range(4)]


def test_site_values_make_a_valid_config():
    cfg = parse_config(site_data())
    assert [n.name for n in cfg.cluster.nodes] == ["node0", "node1", "node2", "node3"]
    assert cfg.models.target.path == "/path/to/models/Kimi-K3-w4a8"


@pytest.mark.parametrize(
    ("change", "value"),
    [("bench__num_prompts", 7), ("smoke__request_timeout_s", 9), ("serve__liveness", {"stall_timeout_s": 5}),
     ("serve__readiness", {"poll_s": 1}), ("cluster__on_busy", "refuse"), ("cluster__hold_beat_s", 2),
     ("models__threads", 9), ("models__read_timeout_s", 7), ("server__grace_seconds", 30),
     ("store__on_unreachable", "local")],
)  # fmt: skip
def test_settings_that_do_not_shape_the_servers_keep_their_fingerprint(change, value):
    """A rerun of bench with other workloads, or teardown, still finds the servers launch labelled."""
    assert (
        parse_config(with_changes(site_data(), **{change: value})).fingerprint()
        == parse_config(site_data()).fingerprint()
    )


@pytest.mark.parametrize(("change", "value"), [("serve__max_num_seqs", 3), ("image__ref", "registry.example/x:2")])
def test_settings_that_shape_the_servers_change_their_fingerprint(change, value):
    assert (
        parse_config(with_changes(site_data(), **{change: value})).fingerprint()
        != parse_config(site_data()).fingerprint()
    )


def test_reference_with_placeholders_is_refused_naming_each_field():
    with pytest.raises(ConfigError) as info:
        load_config(REFERENCE)
    fields = dict(info.value.problems)
    assert "<NODE2_IP>" in fields["cluster.nodes[2].address"]
    assert "<NODE3_NIC>" in fields["cluster.nodes[3].nic"]
    assert "<MODEL_ROOT>" in fields["cluster.model_root"]
    assert "<IMAGE_DIGEST>" in fields["image.digest"]
    assert str(REFERENCE) in str(info.value)


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"serve__tensor_parallel_size": 8}, "serve.tensor_parallel_size", "offers 64 NPUs"),
        ({"cluster__npus_per_node": 8}, "serve.tensor_parallel_size", "offers 32 NPUs"),
        ({"serve__expert_parallel_size": 16}, "serve.expert_parallel_size", "DP × TP = 64"),
        ({"serve__data_parallel_size_local": 3}, "serve.data_parallel_size_local", "does not divide"),
        ({"serve__data_parallel_size_local": 2}, "cluster.nodes", "2 nodes are needed"),
        ({"serve__service_port": 70000}, "serve.service_port", "less than or equal to 65535"),
        ({"serve__rpc_port": 0}, "serve.rpc_port", "greater than or equal to 1"),
        ({"serve__rpc_port": 8000}, "serve.rpc_port", "also serve.service_port"),
        ({"serve__max_num_seqs": "many"}, "serve.max_num_seqs", "valid integer"),
        ({"serve__enable_prefix_caching": "perhaps"}, "serve.enable_prefix_caching", "valid boolean"),
        ({"serve__max_num_sequences": 4}, "serve.max_num_sequences", "unknown key"),
        ({"clutser": {}}, "clutser", "unknown key"),
        ({"serve__container__devces": []}, "serve.container.devces", "unknown key"),
        ({"image__digest": None}, "image.digest", "not pinned"),
        ({"image__digest": "sha256:abc"}, "image.digest", "64 hex digits"),
        ({"cluster__model_root": "models"}, "cluster.model_root", "absolute path"),
        ({"models__target__path": "/elsewhere/k3"}, "models.target.path", "outside cluster.model_root"),
        ({"serve__served_model_name": "kimi\nk3"}, "serve.served_model_name", "control character"),
        ({"serve__env": {"HCCL_IF_IP": "${LOCL_IP}"}}, "serve.env.HCCL_IF_IP", "refers to LOCL_IP"),
        ({"serve__env": {"PRICE": "5$"}}, "serve.env.PRICE", "stray $"),
        ({"serve__env": {"MODEL_PATH": "/x"}}, "serve.env.MODEL_PATH", "derived"),
        ({"serve__env": {"BAD-NAME": "1"}}, "serve.env.BAD-NAME", "not a valid environment variable name"),
        ({"cluster__nodes__2__address": "<NODE2_IP>"}, "cluster.nodes[2].address", "placeholder <NODE2_IP>"),
        ({"models__draft": {"repo": "Inferact/Kimi-K3-DSpark", "path": "<DSPARK_DRAFT_PATH>"}},
         "models.draft.path", "placeholder <DSPARK_DRAFT_PATH>"),
    ],
)  # fmt: skip
def test_bad_value_names_the_field(change, field, words):
    problems = problems_of(with_changes(site_data(), **change))
    assert field in problems, problems
    assert words in problems[field]


@pytest.mark.parametrize(
    ("draft", "words"),
    [
        ({"repo": "RadixArk/Kimi-K3-DSpark", "num_speculative_tokens": 5}, "gqa draft proposes 7 tokens, not 5"),
        ({"repo": "Inferact/Kimi-K3-DSpark", "num_speculative_tokens": 5}, "mla draft proposes 7 tokens, not 5"),
        ({"repo": "Inferact/Kimi-K3-DSpark-Block5", "num_speculative_tokens": 7}, "proposes 5 tokens, not 7"),
        ({"repo": "me/own-draft", "kind": "mla-block5", "num_speculative_tokens": 7}, "proposes 5 tokens, not 7"),
    ],
)
def test_speculative_token_count_must_fit_the_draft(draft, words):
    problems = problems_of(with_changes(site_data(), models__draft=draft))
    assert words in problems["models.draft.num_speculative_tokens"]


def test_unknown_draft_needs_a_kind():
    problems = problems_of(with_changes(site_data(), models__draft={"repo": "me/own-draft"}))
    assert "not a known draft" in problems["models.draft.kind"]


def test_draft_kind_must_agree_with_a_known_repo():
    problems = problems_of(with_changes(site_data(), models__draft={"repo": "RadixArk/Kimi-K3-DSpark", "kind": "mla"}))
    assert "is a gqa draft" in problems["models.draft.kind"]


def test_draft_max_model_len_not_above_target():
    data = with_changes(site_data(), models__draft={"repo": "Inferact/Kimi-K3-DSpark", "max_model_len": 200000})
    assert "above the target's serve.max_model_len 133120" in problems_of(data)["models.draft.max_model_len"]


@pytest.mark.parametrize("attr", ["address", "name"])
def test_duplicate_node_values_are_named(attr):
    nodes = four_nodes()
    nodes[3][attr] = nodes[1][attr]
    problems = problems_of(with_changes(site_data(), cluster__nodes=nodes))
    assert "already used by cluster.nodes[1]" in problems[f"cluster.nodes[3].{attr}"]


def test_wrong_node_count_for_dp():
    problems = problems_of(with_changes(site_data(), cluster__nodes=four_nodes()[:3]))
    assert "3 nodes listed" in problems["cluster.nodes"]


def test_every_problem_is_reported_at_once():
    data = with_changes(site_data(), serve__rpc_port=8000, serve__expert_parallel_size=8, image__digest=None)
    assert {"serve.rpc_port", "serve.expert_parallel_size", "image.digest"} <= set(problems_of(data))


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster:\n  nodes: [\n  model_root: /x\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(bad) in str(info.value) and "line " in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("source", "is_path"),
    [("site.yaml", True), ("site.yml", True), ("configs/site", True), ("/etc/k3/site", True), ("lab-a", False),
     ("lab.a", False)],
)  # fmt: skip
def test_a_config_is_a_yaml_path_or_a_saved_blocks_name_decided_in_one_place(source: str, is_path: bool, tmp_path):
    assert is_yaml_path(source) is is_path
    (tmp_path / "lab-b").write_text("cluster: {}\n")  # a file here by a block-like name is the file
    assert is_yaml_path(str(tmp_path / "lab-b")) and not is_yaml_path("lab-b")


def test_document_must_be_a_mapping():
    assert "must be a mapping" in problems_of(["not", "a", "mapping"])[""]


# -- cluster.npus_per_node: 0 declares no NPUs; with transport local every node is this machine ---------------

LOCAL_PROFILE = REFERENCE.parent / "local.yaml"


def local_profile(**change) -> dict:
    """configs/local.yaml declaring no NPUs, both nodes at 127.0.0.1 on lo, plus `change`."""
    data = yaml.safe_load(LOCAL_PROFILE.read_text())
    local = [{"name": f"local{i}", "address": "127.0.0.1", "nic": "lo"} for i in range(2)]
    return with_changes(data, **{"cluster__npus_per_node": 0, "cluster__nodes": local, **change})


def test_zero_npus_is_accepted_and_the_npu_topology_check_does_not_apply():
    cfg = parse_config(with_changes(site_data(), cluster__npus_per_node=0))  # DP × TP = 64 ranks, 0 NPUs
    assert cfg.cluster.npus_per_node == 0
    assert "0 declares no NPUs" in type(cfg.cluster).model_fields["npus_per_node"].description


def test_zero_npus_keeps_every_other_check():
    data = with_changes(
        site_data(), cluster__npus_per_node=0, serve__data_parallel_size_local=2, serve__expert_parallel_size=16,
        serve__rpc_port=8000,
    )  # fmt: skip
    problems = problems_of(data)
    assert "2 nodes are needed" in problems["cluster.nodes"]
    assert "DP × TP = 64" in problems["serve.expert_parallel_size"]
    assert "also serve.service_port" in problems["serve.rpc_port"]
    assert "serve.tensor_parallel_size" not in problems


def test_negative_npus_are_refused():
    assert (
        "greater than or equal to 0"
        in problems_of(with_changes(site_data(), cluster__npus_per_node=-1))["cluster.npus_per_node"]
    )


def test_npus_declared_still_must_fit_the_ranks():
    problems = problems_of(with_changes(site_data(), cluster__npus_per_node=1))
    assert "offers 4 NPUs (4 nodes × 1)" in problems["serve.tensor_parallel_size"]


def test_local_profile_without_npus_on_one_address_is_valid():
    cfg = parse_config(local_profile())
    assert cfg.cluster.transport == "local" and cfg.cluster.npus_per_node == 0
    assert {n.serving_ip for n in cfg.cluster.nodes} == {"127.0.0.1"}


def test_local_nodes_still_need_distinct_names():
    nodes = [{"name": "local0", "address": "127.0.0.1", "nic": "lo"}] * 2
    problems = problems_of(local_profile(cluster__nodes=nodes))
    assert "already used by cluster.nodes[0]" in problems["cluster.nodes[1].name"]


@pytest.mark.parametrize(("attr", "field"), [("address", "address"), ("local_ip", "local_ip")])
def test_ssh_nodes_still_need_distinct_addresses(attr, field):
    nodes = four_nodes()
    nodes[2][attr] = nodes[0]["address"]
    problems = problems_of(with_changes(site_data(), cluster__nodes=nodes))
    assert "already used by cluster.nodes[0]" in problems[f"cluster.nodes[2].{field}"]


def test_auto_tool_choice_without_a_tool_call_parser_is_refused_before_any_node_is_touched():
    """vLLM refuses it at start-up (`--enable-auto-tool-choice requires --tool-call-parser`): refused here."""
    refused = problems_of(with_changes(site_data(), serve__tool_call_parser=None))
    assert "enable_auto_tool_choice" in refused["serve.tool_call_parser"]
    cfg = parse_config(with_changes(site_data(), serve__tool_call_parser=None, serve__enable_auto_tool_choice=False))
    assert cfg.serve.tool_call_parser is None
