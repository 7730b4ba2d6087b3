"""What the image must contain, read from commands run inside it: pure builders and parsers."""

from __future__ import annotations

import json
import re

from k3deploy.core.stage import FailureClass, Finding

PACKAGES = ("vllm", "vllm-ascend")
PIP_SHOW = ["pip", "show", *PACKAGES]
# `--help=all` lists every flag on current vLLM; older releases know only `--help`.
SERVE_HELP = ["sh", "-c", "vllm serve --help=all 2>/dev/null || vllm serve --help"]


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


# vLLM 0.32 lists no choices under --reasoning-parser: its registry is asked instead (its parsers and its lazy ones).
REGISTRY_MARK = "K3REASONING "
REASONING_REGISTRY = (
    "import json; from vllm.reasoning import ReasoningParserManager as m; "
    f"print({REGISTRY_MARK!r} + json.dumps(sorted({{*m.reasoning_parsers, *getattr(m, 'lazy_parsers', {{}})}})))"
)
# The serve flags whose value must be a name the image's vLLM knows, the config field that sets each, and the
# plugin flag that registers more names at start-up (then the image's list is not the whole story).
SERVE_NAMES = {
    "--tokenizer-mode": ("serve.tokenizer_mode", None),
    "--tool-call-parser": ("serve.tool_call_parser", "--tool-parser-plugin"),
    "--reasoning-parser": ("serve.reasoning_parser", "--reasoning-parser-plugin"),
}
Choices = dict[str, list[str] | None]  # flag → the names its help lists (None: none listed); a flag absent: no key


def registry_names(output: str) -> list[str] | None:
    """The reasoning parsers the registry command printed; None when it printed none (an error, another vLLM)."""
    for line in output.splitlines():
        if line.startswith(REGISTRY_MARK):
            try:
                names = json.loads(line.removeprefix(REGISTRY_MARK))
            except ValueError:
                return None
            return names if isinstance(names, list) and all(isinstance(n, str) for n in names) else None
    return None


def serve_choices(help_text: str, reasoning: list[str] | None = None) -> Choices:
    """What `vllm serve --help` lists for each flag of SERVE_NAMES: `{a,b}` (argparse choices) or `['a', 'b']`
    (vLLM's literal types), from the flag's own line; the registry's list where the help lists none."""
    out: Choices = {}
    for flag in SERVE_NAMES:
        paragraph = _flag_help(help_text, flag)
        if paragraph is None:
            continue
        first = paragraph.strip().splitlines()[0]
        braces, brackets = re.search(r"\{([^}]*)\}", first), re.search(r"\[([^\]]*)\]", first)
        if braces:
            names = [n.strip() for n in braces.group(1).split(",") if n.strip()]
        else:
            names = re.findall(r"'([^']+)'", brackets.group(1)) if brackets else []
        out[flag] = names or None
    if out.get("--reasoning-parser", []) is None and reasoning is not None:
        out["--reasoning-parser"] = reasoning
    return out


def name_findings(choices: Choices, wanted: dict[str, str | None], extra_args: list[str]) -> list[Finding]:
    """The config's tokenizer mode and parsers against the names the image's vLLM knows: a name it does not know
    is the site's configuration (vLLM would refuse to start), named by its field before any server starts."""
    out = []
    for flag, (field, plugin) in SERVE_NAMES.items():
        value = wanted.get(flag)
        if value is None:
            continue
        known = choices.get(flag)
        if flag not in choices:
            detail = f"{value}: the image's `vllm serve` has no {flag} at all"
            out.append(Finding("image", field, False, detail, cause=FailureClass.CONFIGURATION))
        elif plugin and any(a == plugin or a.startswith(f"{plugin}=") for a in extra_args):
            out.append(Finding("image", field, True, f"{value}: not checked, {plugin} may register it at start-up"))
        elif known is None:
            out.append(Finding("image", field, True, f"{value}: not checked, the image's vLLM lists no {flag} names"))
        elif value in known:
            out.append(Finding("image", field, True, f"{value}: one of the {len(known)} names of {flag}"))
        else:
            detail = (f"{value} is not one of the {len(known)} names the image's vLLM knows for {flag} "
                      f"({', '.join(known)}): vLLM would refuse to start")  # fmt: skip
            out.append(Finding("image", field, False, detail, cause=FailureClass.CONFIGURATION))
    return out
