"""Watch container logs during launch: known fatal lines, start-up milestones, a bounded per-node log.

Pure: no container or Prefect I/O here (the launch tasks stream the logs and call `LogWatcher.feed`).
The lines to look for are data (`log_patterns.json`), so the list grows without code changes.

Speed: almost every line matches nothing, so that case must be cheap. One alternation of all the
full patterns is no faster than a loop over them (Python's regex engine tries every branch at every
position), so each pattern's *required literal* (e.g. "NPU out of memory") is taken from its parse
tree and all of them go into one trie-shaped regex: a line without any of them costs one search.
A line with one (rare) is checked against every pattern. `python -m benchmarks.log_buffer` measures it.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from k3deploy.core.errors import ConfigError
from k3deploy.core.stage import FailureClass

DEFAULT_PATTERNS = Path(__file__).with_name("log_patterns.json")
MAX_EVENT_LINE = 500  # characters of the line kept in a LogEvent
MAX_KEPT_FATALS = 100  # fatal events kept by a watcher; a node can repeat one forever
MIN_ANCHOR = 3  # shorter required literals would make the pre-filter fire on most lines
CLASSES = {c.value for c in FailureClass}
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")

Kind = Literal["milestone", "fatal", "user_text"]
_ENTRY_KEYS = {
    "fatal": {"id", "pattern", "why", "capture", "examples", "family", "class", "consequence"},
    "milestone": {"id", "pattern", "capture", "examples"},
    "user_text": {"id", "pattern", "why", "examples"},
}


def strip_ansi(text: str) -> str:
    """Remove colour and cursor escape sequences (vLLM colours its log when it thinks it has a terminal)."""
    return ANSI.sub("", text) if "\x1b" in text else text


@dataclass(frozen=True)
class LinePattern:
    """One entry of the patterns file, compiled."""

    kind: Kind
    id: str
    regex: re.Pattern[str]
    capture: str | None = None
    why: str | None = None
    family: str | None = None  # the kind of failure (fatal only): several patterns may name one
    failure_class: str | None = None  # whose problem it is (a FailureClass value); None: the stage's default
    consequence: bool = False  # what other processes say after a failure: its cause is in the lines before

    def value(self, match: re.Match[str]) -> str | None:
        return match.group(self.capture) if self.capture else None


@dataclass(frozen=True)
class Patterns:
    """The compiled patterns plus the pre-filter built from their required literals.

    A line is named by the first fatal pattern that matches it (file order: specific causes before the
    families), and a line that quotes user text (`user_text`, e.g. vLLM's request logger) matches nothing.
    """

    fatal: tuple[LinePattern, ...]
    milestones: tuple[LinePattern, ...]
    prefilter: re.Pattern[str] | None  # None when no pattern has a usable required literal
    unanchored: tuple[LinePattern, ...]  # patterns without one: searched on every line
    user_text: tuple[LinePattern, ...] = ()  # searched only on a line that matched something

    @cached_property
    def all(self) -> tuple[LinePattern, ...]:
        return self.fatal + self.milestones

    @cached_property
    def by_id(self) -> dict[str, LinePattern]:
        return {p.id: p for p in self.all}

    def match(self, line: str) -> list[tuple[LinePattern, str | None]]:
        """The first fatal pattern and every milestone found in `line`, with their captured values."""
        if self.prefilter is not None and self.prefilter.search(line) is None:
            candidates = self.unanchored
            if not candidates:
                return []
        else:
            candidates = self.all
        return self.naive_match(line, candidates)

    def naive_match(
        self, line: str, candidates: Iterable[LinePattern] | None = None
    ) -> list[tuple[LinePattern, str | None]]:
        """The same answer as `match`, by searching every pattern (the reference, and the benchmark's baseline)."""
        hits: list[tuple[LinePattern, str | None]] = []
        named = False  # a fatal pattern already named this line
        for pattern in self.all if candidates is None else candidates:
            if named and pattern.kind == "fatal":
                continue
            found = pattern.regex.search(line)
            if found is not None:
                hits.append((pattern, pattern.value(found)))
                named = named or pattern.kind == "fatal"
        if hits and any(quoting.regex.search(line) for quoting in self.user_text):
            return []
        return hits


def load_patterns(path: Path | str = DEFAULT_PATTERNS) -> Patterns:
    """Read, validate and compile a patterns file; a bad entry raises ConfigError naming it."""
    source = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError([("", f"cannot read the log patterns: {exc}")], source) from None
    return compile_patterns(data, source)


def compile_patterns(data: Any, source: str = "<patterns>") -> Patterns:
    """Validate and compile the patterns document (the parsed JSON); every problem is reported at once."""
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("fatal"), list)
        or not isinstance(data.get("milestones"), list)
        or not isinstance(data.get("user_text", []), list)
    ):
        expected = "expected an object with lists 'fatal', 'milestones' and (optional) 'user_text'"
        raise ConfigError([("", expected)], source)
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    compiled: dict[str, list[LinePattern]] = {"fatal": [], "milestones": [], "user_text": []}
    sections: tuple[tuple[str, Kind], ...] = (
        ("fatal", "fatal"),
        ("milestones", "milestone"),
        ("user_text", "user_text"),
    )
    for section, kind in sections:
        for index, entry in enumerate(data.get(section, [])):
            pattern = _compile_entry(kind, entry, f"{section}[{index}]", seen, problems)
            if pattern is not None:
                compiled[section].append(pattern)
    if problems:
        raise ConfigError(problems, source)
    fatal, milestones = tuple(compiled["fatal"]), tuple(compiled["milestones"])
    anchors: list[str] = []
    unanchored: list[LinePattern] = []
    for pattern in fatal + milestones:
        literals = required_literals(pattern.regex)
        if literals is None or min(map(len, literals)) < MIN_ANCHOR:
            unanchored.append(pattern)
        else:
            anchors += literals
    prefilter = re.compile(_trie(anchors)) if anchors else None
    return Patterns(fatal, milestones, prefilter, tuple(unanchored), tuple(compiled["user_text"]))


def _compile_entry(
    kind: Kind, entry: Any, where: str, seen: set[str], problems: list[tuple[str, str]]
) -> LinePattern | None:
    if not isinstance(entry, dict):
        problems.append((where, "must be an object"))
        return None
    before = len(problems)
    ident = entry.get("id")
    if not (isinstance(ident, str) and ident):
        problems.append((f"{where}.id", "must be a non-empty string"))
    elif ident in seen:
        problems.append((f"{where} ({ident}).id", "is used twice (ids must be unique across fatal and milestones)"))
    else:
        seen.add(ident)
    if isinstance(ident, str) and ident:
        where = f"{where} ({ident})"
    extra = set(entry) - _ENTRY_KEYS[kind]
    if extra:
        problems.append((where, f"unknown key(s) {sorted(extra)}; allowed: {sorted(_ENTRY_KEYS[kind])}"))
    for key in ("why", "capture", "family"):
        if key in entry and not (isinstance(entry[key], str) and entry[key]):
            problems.append((f"{where}.{key}", "must be a non-empty string"))
    if "class" in entry and entry["class"] not in CLASSES:
        problems.append((f"{where}.class", f"must be one of {sorted(CLASSES)}"))
    if "consequence" in entry and not isinstance(entry["consequence"], bool):
        problems.append((f"{where}.consequence", "must be true or false"))
    if kind != "milestone" and "why" not in entry:
        problems.append((f"{where}.why", "is required: one line saying what to do"))
    source = entry.get("pattern")
    if not (isinstance(source, str) and source):
        problems.append((f"{where}.pattern", "must be a non-empty string (a Python regex)"))
        return None
    try:
        regex = re.compile(source)
    except re.error as exc:
        problems.append((f"{where}.pattern", f"invalid regex {source!r}: {exc}"))
        return None
    capture, examples = entry.get("capture"), entry.get("examples")
    if isinstance(capture, str) and capture not in regex.groupindex:
        problems.append((f"{where}.capture", f"the pattern has no group (?P<{capture}>...)"))
    if examples is not None and not (isinstance(examples, list) and examples):
        problems.append((f"{where}.examples", "must be a non-empty list of {line, source}"))
    else:
        for i, example in enumerate(examples or []):
            line, origin = (example.get("line"), example.get("source")) if isinstance(example, dict) else (None, None)
            if not (isinstance(line, str) and line and isinstance(origin, str) and origin):
                problems.append((f"{where}.examples[{i}]", "must be {line, source}, both non-empty strings"))
            elif not regex.search(strip_ansi(line)):
                problems.append((f"{where}.examples[{i}]", "does not match its own pattern"))
    if len(problems) > before or not isinstance(ident, str):  # a non-string id was reported above
        return None
    return LinePattern(kind, ident, regex, capture, entry.get("why"), entry.get("family"), entry.get("class"),
                       entry.get("consequence", False))  # fmt: skip


def required_literals(regex: re.Pattern[str]) -> list[str] | None:
    """Literals of which at least one is in every string the regex finds; None when none is certain.

    Uses the standard library's regex parser (private, but stable since 3.11); if it ever changes
    shape this returns None and the pattern is simply searched on every line.
    """
    if regex.flags & re.IGNORECASE:
        return None
    try:
        from re import _constants, _parser  # type: ignore[attr-defined]

        return _literals(_parser.parse(regex.pattern, regex.flags).data, _constants)
    except Exception:  # an optimisation only: fall back to searching the pattern on every line
        return None


def _literals(items: list[tuple[Any, Any]], c: Any) -> list[str] | None:
    """The best set of required literals of a parsed sequence (see `_score`)."""
    best: list[str] | None = None
    run: list[str] = []

    def consider(found: list[str] | None) -> None:
        nonlocal best
        if found and (best is None or _score(found) > _score(best)):
            best = found

    for op, av in items:
        if op is c.LITERAL:
            run.append(chr(av))
            continue
        consider(_from_run("".join(run)))
        run = []
        if op is c.SUBPATTERN and not av[1] & re.IGNORECASE:
            consider(_literals(av[3], c))
        elif op is c.ATOMIC_GROUP:
            consider(_literals(av, c))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT) and av[0] >= 1:
            consider(_literals(av[2], c))
        elif op is c.BRANCH:
            branches = [_literals(branch, c) for branch in av[1]]
            if all(branches):
                consider([literal for branch in branches for literal in branch])  # type: ignore[union-attr]
    consider(_from_run("".join(run)))
    return best


def _from_run(run: str) -> list[str] | None:
    """A run of literal characters, cut to start at its first capital when that leaves enough of it."""
    if not run:
        return None
    start = next((i for i, ch in enumerate(run) if ch.isupper()), 0)
    return [run[start:]] if len(run) - start >= MIN_ANCHOR else [run]


def _score(literals: list[str]) -> tuple[bool, int]:
    """Prefer literals of 6+ characters that start with a capital (few positions in a log line do), then length."""
    shortest = min(map(len, literals))
    return shortest >= 6 and all(literal[0].isupper() for literal in literals), shortest


def _trie(words: list[str]) -> str:
    """A regex matching any of `words`, with shared prefixes factored (far faster than a flat alternation)."""
    if "" in words:
        return ""  # a shorter word already suffices: finding it is all the pre-filter needs
    groups: dict[str, list[str]] = {}
    for word in words:
        groups.setdefault(word[0], []).append(word[1:])
    branches = [re.escape(first) + _trie(rest) for first, rest in sorted(groups.items())]
    return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"


@dataclass(frozen=True)
class LogEvent:
    """A fatal line or a milestone seen in one node's log."""

    node: str
    rank: int
    kind: Kind
    id: str
    line: str  # ANSI-free, stripped, at most MAX_EVENT_LINE characters
    at: float  # the watcher's clock when the line was fed
    value: str | None = None  # the pattern's `capture` group
    why: str | None = None  # fatal only: what a person should do


def _shorten(line: str) -> str:
    return line if len(line) <= MAX_EVENT_LINE else line[: MAX_EVENT_LINE - 1] + "…"


class LogWatcher:
    """Matches every node's log lines; records each milestone once per node and every fatal line.

    Thread-safe: the launch stage feeds it from one thread per container.
    """

    def __init__(self, patterns: Patterns, clock: Callable[[], float] = time.monotonic) -> None:
        self.patterns = patterns
        self._clock = clock
        self._lock = threading.Lock()
        self._milestones: dict[str, dict[str, LogEvent]] = {}
        self._fatals: list[LogEvent] = []
        self.fatal_count = 0

    def feed(self, node: str, rank: int, line: str) -> list[LogEvent]:
        """Match one log line; returns the fatal events and the milestones new for this node."""
        text = line.strip()
        if "\x1b" in text:
            text = strip_ansi(text).strip()
        hits = self.patterns.match(text)
        if not hits:
            return []
        at, shown = self._clock(), _shorten(text)
        events = []
        with self._lock:
            for pattern, value in hits:
                event = LogEvent(node, rank, pattern.kind, pattern.id, shown, at, value, pattern.why)
                if pattern.kind == "fatal":
                    self.fatal_count += 1
                    if len(self._fatals) < MAX_KEPT_FATALS:
                        self._fatals.append(event)
                else:
                    seen = self._milestones.setdefault(node, {})
                    if pattern.id in seen:
                        continue
                    seen[pattern.id] = event
                events.append(event)
        return events

    def milestones(self) -> dict[str, dict[str, float]]:
        """node -> milestone id -> clock value when first seen, in the order seen."""
        with self._lock:
            return {node: {mid: e.at for mid, e in seen.items()} for node, seen in self._milestones.items()}

    def milestone_events(self) -> list[LogEvent]:
        """Every recorded milestone, oldest first."""
        with self._lock:
            events = [e for seen in self._milestones.values() for e in seen.values()]
        return sorted(events, key=lambda e: e.at)

    def first_fatal(self) -> LogEvent | None:
        with self._lock:
            return self._fatals[0] if self._fatals else None

    def fatals(self) -> list[LogEvent]:
        """The fatal events seen, oldest first (the first MAX_KEPT_FATALS; `fatal_count` counts all)."""
        with self._lock:
            return list(self._fatals)

    def milestone_rows(self, started_at: float) -> list[dict[str, Any]]:
        """Rows for a Prefect table artifact: one per node and milestone, oldest first."""
        return [
            {
                "node": e.node,
                "rank": e.rank,
                "milestone": e.id,
                "seconds": round(e.at - started_at, 1),
                "value": e.value or "",
            }
            for e in self.milestone_events()
        ]


class LogBuffer:
    """The last `max_lines` lines of one container's log in memory, and every line in `path`.

    Memory is bounded whatever the log length: a deque of at most `max_lines` lines, each cut to
    `max_line_chars` (the file keeps them whole). Writes go through a 64 KiB buffer; `flush()` before
    reading the file while the container still runs. Lines appended after `close()` are kept in
    memory only.
    """

    def __init__(self, max_lines: int, path: Path | None = None, max_line_chars: int = 8192) -> None:
        if max_lines < 1:
            raise ValueError(f"max_lines must be at least 1, got {max_lines}")
        self.max_lines, self.path, self.max_line_chars = max_lines, path, max_line_chars
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._seen = 0
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a", encoding="utf-8", errors="backslashreplace", buffering=1 << 16)

    def append(self, line: str) -> None:
        line = line.rstrip("\r\n")
        with self._lock:
            self._seen += 1
            self._lines.append(line if len(line) <= self.max_line_chars else line[: self.max_line_chars] + "…")
            if self._file is not None:
                self._file.write(line + "\n")

    def numbered(self) -> tuple[int, list[str]]:
        """The kept lines and the number (1-based) of the first of them in the whole log."""
        with self._lock:
            return self._seen - len(self._lines) + 1, list(self._lines)

    def tail(self, n: int | None = None) -> list[str]:
        """The last `n` lines kept (all kept lines when n is None)."""
        with self._lock:
            lines = list(self._lines)
        return lines if n is None else lines[max(0, len(lines) - n) :]

    @property
    def lines_seen(self) -> int:
        return self._seen

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> LogBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
