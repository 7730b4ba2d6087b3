"""What the image must contain, read from commands run inside it: pure builders and parsers."""

from __future__ import annotations

import re

from k3deploy.core.stage import Finding

PACKAGES = ("vllm", "vllm-ascend")
PIP_SHOW = ["pip", "show", *PACKAGES]
# `--help=all` lists every flag on current vLLM; older releases know only `--help`.
SERVE_HELP = ["sh", "-c", "vllm serve --help=all 2>/dev/null || vllm serve --help"]
KIMI = "kimi_k3"
KIMI_FLAGS = ("--tokenizer-mode", "--reasoning-parser", "--tool-call-parser")


def parse_pip_show(text: str) -> dict[str, str]:
    """`pip show a b` → {name: version}, names normalised (vllm_ascend and vllm-ascend are one)."""
    versions = {}
    for block in re.split(r"^---\s*$", text, flags=re.MULTILINE):
        fields = dict(
            (key.strip().lower(), value.strip())
            for key, _, value in (line.partition(":") for line in block.splitlines())
            if value
        )
        if "name" in fields and "version" in fields:
            versions[normalise(fields["name"])] = fields["version"]
    return versions


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def version_findings(versions: dict[str, str], packages: tuple[str, ...] = PACKAGES) -> list[Finding]:
    return [
        Finding(
            "image",
            f"{name} installed",
            name in versions,
            versions.get(name, "not installed (pip show found no such package)"),
        )
        for name in packages
    ]


def _flag_help(text: str, flag: str) -> str | None:
    """The help paragraph of one flag: from its line to the next line that starts another flag."""
    match = re.search(rf"^\s*{re.escape(flag)}[\s=,{{]", text, flags=re.MULTILINE)
    if match is None:
        return None
    rest = text[match.start() :]
    following = re.search(r"^\s*--[a-z]", rest[len(flag) + 2 :], flags=re.MULTILINE)
    return rest if following is None else rest[: following.start() + len(flag) + 2]


# vLLM 0.32 lists no choices under --reasoning-parser: its registry is asked instead.
REASONING_REGISTRY = (
    "from vllm.reasoning import ReasoningParserManager as m; m.get_reasoning_parser('kimi_k3'); "
    "print('reasoning parser kimi_k3 registered')"
)


def registry_said(output: str) -> bool:
    return "reasoning parser kimi_k3 registered" in output


def kimi_findings(help_text: str, reasoning_registered: bool | None = None) -> list[Finding]:
    """The Kimi-K3 tokenizer mode and parsers the seed's `vllm serve` line needs.

    `reasoning_registered`: what vLLM's reasoning-parser registry said, for versions whose help lists
    no choices for --reasoning-parser.
    """
    out = []
    for flag in KIMI_FLAGS:
        paragraph = _flag_help(help_text, flag)
        if paragraph is None:
            out.append(Finding("image", f"{flag} {KIMI}", False, f"`vllm serve --help` has no {flag}"))
        elif reasoning_registered is not None and flag == "--reasoning-parser" and "{" not in paragraph:
            detail = "registered in vLLM's reasoning-parser registry" if reasoning_registered else "not registered"
            out.append(Finding("image", f"{flag} {KIMI}", reasoning_registered, detail))
        else:
            ok = re.search(rf"\b{KIMI}\b", paragraph) is not None
            first = paragraph.strip().splitlines()[0][:160]
            out.append(Finding("image", f"{flag} {KIMI}", ok, first if ok else f"{KIMI} is not among: {first}"))
    return out
