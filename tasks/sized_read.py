"""Reading a file through a command's output, with proof that the whole file arrived.

Podman's Docker-API exec can hand back an empty stream for a command that exited 0 (seen here: one
`cat` in 150 on a loaded 2-core machine: benchmarks/exec_output_loss.py), and a result read
back empty would be judged damaged evidence. So the command prints the file's size before it and a
marker after it; an answer without both, or of another size, was lost on the way and is read again.
A setup script sourced before the command may print lines of its own: the markers are searched for.
"""

from __future__ import annotations

import re
import shlex

SIZE = "k3deploy-size"
END = "k3deploy-end"
_SIZE_LINE = re.compile(rf"^{SIZE} (\d+)$", re.MULTILINE)


def sized_read_command(path: str) -> str:
    """`cat` between a size line and an end marker; exits non-zero (and prints neither) when it cannot read."""
    p = shlex.quote(path)
    return f"n=$(wc -c < {p}) && printf '{SIZE} %s\\n' \"$n\" && cat {p} && printf '\\n{END}\\n'"


def parse_sized(output: str) -> str | None:
    """The file's text when the output holds all of it; None when the output was cut or lost on the way."""
    found = _SIZE_LINE.search(output)
    if found is None:
        return None
    body = output[found.end() + 1 :]
    end = body.rfind(f"\n{END}")
    if end < 0:
        return None
    text = body[:end]
    return text if len(text.encode()) == int(found.group(1)) else None
