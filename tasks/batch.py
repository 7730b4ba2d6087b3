"""Many checks in one SSH exec: render sections into one shell script, split its output back.

A node answers ~150 tool calls per phase; one exec per call would cost ~50 ms of session
set-up each. The script runs the sections `parallel` at a time (each under its own
`timeout`, so one hung tool costs its section, not the node's report), writes each
section's output and exit code to a private temp folder, and prints them in order between
delimiter lines that carry a per-run random token, so tool output can never fake one.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from k3deploy.tasks.transport.base import TIMEOUT_EXIT_CODES

MAX_SCRIPT = 120_000  # one argv element (the remote `sh -c` script) may not exceed 128 KiB on Linux
_TOKEN = re.compile(r"[A-Za-z0-9]{8,64}")


@dataclass(frozen=True)
class Section:
    """One command of a batch; `key` names it in the parsed result."""

    key: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class SectionOutput:
    """What one section printed (stdout and stderr together) and its exit code (None: never finished)."""

    key: str
    rc: int | None
    text: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


def _check(sections: Sequence[Section], token: str) -> None:
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"token must be 8-64 letters or digits, got {token!r}")
    keys = [s.key for s in sections]
    if len(set(keys)) != len(keys):
        raise ValueError("section keys must be unique")
    if any(not s.argv for s in sections):
        raise ValueError("a section needs a command")


def render_script(
    sections: Sequence[Section],
    token: str,
    *,
    parallel: int = 16,
    section_timeout: float = 30,
    busy: Sequence[str] = (),
    attempts: int = 1,
) -> str:
    """The POSIX sh script that runs every section and prints them back between delimiters.

    A section whose output holds one of the `busy` texts (a tool refusing concurrent use) is run
    again, up to `attempts` times in all, after a pause that grows with each try.
    """
    _check(sections, token)
    if parallel < 1 or section_timeout <= 0 or attempts < 1:
        raise ValueError("parallel and attempts must be >= 1 and section_timeout > 0")
    programs: dict[str, str] = {}  # each distinct program once, as a variable: keeps the script short
    for s in sections:
        programs.setdefault(s.argv[0], f"p{len(programs)}")
    lines = [
        f"T={token}",
        *(f"{var}={shlex.quote(prog)}" for prog, var in programs.items()),
        'd=$(mktemp -d "${TMPDIR:-/tmp}/k3comm.XXXXXX") || { echo "k3comm: mktemp failed" >&2; exit 97; }',
        "trap 'rm -rf \"$d\"' EXIT",
        "trap 'exit 143' TERM INT HUP",
        _runner(section_timeout, busy, attempts),
    ]
    for i, s in enumerate(sections):
        args = " ".join(shlex.quote(a) for a in s.argv[1:])
        lines.append(f'r {i} "${programs[s.argv[0]]}" {args} &'.rstrip())
        if (i + 1) % parallel == 0 or i + 1 == len(sections):
            lines.append("wait")
    lines += [
        "i=0",
        f'while [ "$i" -lt {len(sections)} ]; do',
        '  printf "%s BEGIN %s\\n" "$T" "$i"; rc=none',
        '  if [ -f "$d/$i.rc" ]; then cat "$d/$i"; read -r rc <"$d/$i.rc"; fi',
        '  printf "\\n%s END %s %s\\n" "$T" "$i" "$rc"; i=$((i + 1))',
        "done",
    ]
    script = "\n".join(lines) + "\n"
    if len(script) > MAX_SCRIPT:
        raise ValueError(f"batch script of {len(script)} bytes exceeds {MAX_SCRIPT}; split the sections")
    return script


def _runner(section_timeout: float, busy: Sequence[str], attempts: int) -> str:
    """The shell function `r NAME PROGRAM ARGS…`: run one section into $d/NAME and its exit code into $d/NAME.rc.

    A busy tool is asked again after a pause of about `try` seconds, spread at random (awk's rand, seeded
    per section and try) so that sections refused together do not all come back at the same instant.
    """
    run = f'timeout -k 2 {section_timeout:g} "$@" >"$d/$n" 2>&1; c=$?'
    if not busy or attempts == 1:
        return f'r() {{ n=$1; shift; {run}; echo "$c" >"$d/$n.rc"; }}'
    texts = " ".join(f"-e {shlex.quote(b)}" for b in busy)
    pause = 'awk -v s="$$$n$a" -v a="$a" \'BEGIN { srand(s); printf "%.2f", a * (0.3 + rand()) }\''
    return (
        f"r() {{ n=$1; shift; a=1; while :; do {run}; "
        f'if [ "$a" -lt {attempts} ] && grep -q -F {texts} "$d/$n"; then sleep "$({pause})"; a=$((a + 1)); '
        f'else break; fi; done; echo "$c" >"$d/$n.rc"; }}'
    )


def parse_output(sections: Sequence[Section], output: str, token: str) -> dict[str, SectionOutput]:
    """Each section's output by key; a section absent from `output` (script cut short) is left out."""
    _check(sections, token)
    begin = re.compile(rf"^{token} BEGIN (\d+)$")
    end = re.compile(rf"^{token} END (\d+) (-?\d+|none)$")
    found: dict[str, SectionOutput] = {}
    current: int | None = None
    body: list[str] = []
    for line in output.split("\n"):
        if current is None:
            m = begin.match(line)
            if m and int(m[1]) < len(sections):
                current, body = int(m[1]), []
            continue
        m = end.match(line)
        if m and int(m[1]) == current:
            key = sections[current].key
            found[key] = SectionOutput(key, None if m[2] == "none" else int(m[2]), "\n".join(body))
            current = None
        else:
            body.append(line)
    return found


def first_line(text: str) -> str:
    """The first non-blank line, stripped: what a row shows of an error output."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "(no output)")


def outcome(rc: int | None) -> str:
    """How a tool call ended, in words: `exited 255`, `timed out` (its section's timeout), `did not finish`."""
    if rc is None:
        return "did not finish"
    return "timed out" if rc in TIMEOUT_EXIT_CODES else f"exited {rc}"
