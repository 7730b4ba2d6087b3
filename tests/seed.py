"""Read the tutorial's own commands out of its text, so golden tests compare against the source."""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from pathlib import Path

SEED = Path(__file__).parent / "data" / "kimi-k3-vllm-ascend-tutorial.txt"
_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def seed_text() -> str:
    return SEED.read_text()


def section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def commands(text: str, prefix: str) -> list[str]:
    """Every command starting with `prefix`, with backslash continuations joined."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(prefix):
            cmd = line
            while cmd.endswith("\\"):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            found.append(cmd)
    return found


def exports(text: str) -> dict[str, str]:
    """`export NAME=VALUE` lines, values unquoted and $VARs resolved against earlier ones."""
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, raw = line[len("export ") :].partition("=")
            (value,) = shlex.split(raw)
            env[name] = expand(value, env)
    return env


def expand(command: str, env: dict[str, str]) -> str:
    # The seed's quoting is simple: no $ sits inside single quotes, so a plain substitution is exact.
    return _VAR.sub(lambda m: env[m.group(1) or m.group(2)], command)


def speculative_config(text: str) -> dict:
    block = section(text, "--speculative-config \\", "The example proposes")
    return json.loads(block[block.index("{") : block.rindex("}") + 1])


def normalise(value: str | None) -> str | None:
    """JSON values compare as data; everything else as the exact string."""
    if value is not None and value.startswith("{"):
        return json.dumps(json.loads(value), sort_keys=True)
    return value


def flags(argv: list[str]) -> tuple[list[str], Counter]:
    """Split argv into leading positionals and an order-insensitive multiset of (flag, value)."""
    i = 0
    while i < len(argv) and not argv[i].startswith("-"):
        i += 1
    positional, pairs = argv[:i], Counter()
    while i < len(argv):
        flag, value = argv[i], None
        if "=" in flag and flag.startswith("--"):
            flag, value = flag.split("=", 1)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            value = argv[i + 1]
            i += 1
        pairs[(flag, normalise(value))] += 1
        i += 1
    return positional, pairs
