"""The cause line of a rank's failure, read back from its log: the engine's own words, pattern or not.

Pure: lines in, a `Cause` out. A log that ends in a crash holds the cause and then its consequences (an
`EngineDeadError` after an `EL0004`, "Engine core initialization failed. See root cause above." after the
worker's traceback, tracebacks of every process shutting down). So the finder reads the log as candidates:
the exception that ends each traceback (a chained one's first: "The above exception was the direct cause of
the following exception" says which came first) or stands alone on a line, CANN's `E[A-Z0-9]NNNN` code
lines, plog's `[ERROR] MODULE(pid,…)` lines, the runtime's `[Error]: …`, argparse's `error: argument …`, and
the lines a fatal pattern names. It takes the last burst of them (candidates no more than `BURST_GAP` lines
apart) and names its earliest candidate that is not a consequence, a line a family knows by name before a
generic one (torch_npu's "NPU function error: …, error code is 507013" is followed by the CANN lines that say
why). Every process's lines are read apart (vLLM prefixes each with `(EngineCore_DP0 pid=…)`, torch with
`[rank1]:`), so interleaved tracebacks stay whole.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from k3deploy.tasks.watch.logwatch import MAX_EVENT_LINE, LinePattern, Patterns, strip_ansi

BURST_GAP = 40  # lines between two candidates of one crash; a start-up's handled tracebacks lie further back
MAX_DETAIL = 3  # lines of an exception's message printed below it (pydantic's ValidationError) kept
# "(EngineCore_DP0 pid=236) " or "(RayWorkerWrapper pid=9, ip=10.0.0.2) ", then "ERROR 05-12 10:11:12 [core.py:700] "
PROCESS = re.compile(r"^\((?P<who>[^()]*?\bpid=\d+[^()]*)\)\s?")
RANK = re.compile(r"^\[(?P<who>rank\d+)\]:\s?")
HEADER = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?")
TRACEBACK = "Traceback (most recent call last):"
CHAINED = ("The above exception was the direct cause of the following exception:",
           "During handling of the above exception, another exception occurred:")  # fmt: skip
EXCEPTION = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*)(?::(?: (?P<message>.*))?)?$")
GENERIC_FAMILIES = {"cann_error"}  # a code and "Inner Error!" or "call acl api failed"
GENERIC_WORDS = re.compile(r"NPU function error|OPS function error|error code is -?\d+|acl api failed")
FRAME = re.compile(r'^\s+File "[^"]*", line \d+, in (?P<function>[\w<>.]+)')
CONFIG_TYPES = {"ValidationError", "ArgumentError", "ArgumentTypeError"}
CONFIG_FUNCTIONS = re.compile(r"valid|_args$|^parse_args|config|check_")
CANN_CODE = re.compile(r"\bE[A-Z0-9]\d{4}\b")
PLOG_ERROR = re.compile(r"\[ERROR\]\s+[A-Z][A-Z0-9_]*\(\d+,")
RUNTIME_ERROR = re.compile(r"\[Error\]:\s*\S")
ARGPARSE = re.compile(r"(?:^|: )error: (?:argument |unrecognized arguments|the following arguments are required)")
# What a failure makes other processes say after it: never the cause while a cause is in the same burst.
CONSEQUENCE_TYPES = {"EngineDeadError", "EngineGenerateError", "SystemExit", "KeyboardInterrupt", "CancelledError",
                     "BrokenPipeError", "ConnectionResetError", "EOFError", "ContextTerminated",
                     "ChildProcessError"}  # fmt: skip
CONSEQUENCE_WORDS = re.compile(
    r"[Ss]ee (?:the )?(?:root cause|stack trace)|died unexpectedly|shutting down|[Ss]hutdown|Exception ignored in"
)


@dataclass(frozen=True)
class Cause:
    """A rank's failure in the engine's words: the line, where it is in the log, and what kind of line it is."""

    line: str  # as the log has it (ANSI codes removed, cut at MAX_EVENT_LINE)
    number: int  # 1-based, of the lines given
    kind: str  # "exception", "cann_code", "plog_error", "runtime_error", "argparse" or "pattern"
    exception: str | None = None  # the exception's type, for kind "exception"
    pattern: LinePattern | None = None  # the fatal pattern that names the line, if one does
    consequence: bool = False  # only a consequence was found (the cause is in another rank's log)
    detail: tuple[str, ...] = ()  # the message's lines below it, when it has some
    raised_in: str | None = None  # the function of the traceback's last frame ("validate_api_server_args")

    def text(self) -> str:
        """The line and, when the message goes on below it, those lines."""
        return " | ".join((self.line, *self.detail))


@dataclass
class _Candidate:
    start: int  # 0-based index of the first line (a traceback's own first line)
    end: int
    cause: Cause


@dataclass
class _Traceback:
    start: int
    chained_to: _Candidate | None = None  # the exception this one happened in the handling of
    detail_of: _Candidate | None = None  # the exception whose message lines follow
    frames: bool = True  # still reading frames (indented lines)
    function: str | None = None  # of the last frame read


@dataclass
class _State:
    open: dict[str, _Traceback] = field(default_factory=dict)  # per process: a traceback being read
    last_exception: dict[str, _Candidate] = field(default_factory=dict)  # per process: for a chained one
    chain_next: dict[str, bool] = field(default_factory=dict)  # per process: the next traceback is chained


def split_prefix(line: str) -> tuple[str, str]:
    """(who printed it, the line's own text): vLLM's process prefix and log header, torch's `[rankN]:`."""
    who, body = "", strip_ansi(line)
    for prefix in (PROCESS, RANK):
        found = prefix.match(body)
        if found:
            who += found.group("who") + " "
            body = body[found.end() :]
    found = HEADER.match(body)
    return who.strip(), body[found.end() :] if found else body


def find_cause(lines: Sequence[str], patterns: Patterns) -> Cause | None:
    """The earliest non-consequence candidate of the log's last burst (see the module's docstring); a burst of
    consequences only gives its first, marked `consequence`; None when the log has no candidate at all."""
    candidates = _candidates(lines, patterns)
    if not candidates:
        return None
    burst = [candidates[-1]]
    for candidate in reversed(candidates[:-1]):
        if burst[0].start - candidate.end > BURST_GAP:
            break
        burst.insert(0, candidate)
    named = [_named(c.cause, patterns) for c in burst]
    # the earliest cause a family knows by name, else the earliest generic one (a runtime call's error code, which
    # the lines after it explain), else the first consequence
    return min(named, key=lambda cause: (cause.consequence, _generic(cause), cause.number))


def _named(cause: Cause, patterns: Patterns) -> Cause:
    """The cause with the fatal pattern that knows its text (`torch.OutOfMemoryError: NPU out of memory`)."""
    if cause.pattern is not None:
        return cause
    named = next((p for p, _ in patterns.match(cause.text()) if p.kind == "fatal"), None)
    return dataclasses.replace(cause, pattern=named) if named is not None else cause


def _generic(cause: Cause) -> bool:
    """A line that says a runtime call failed with a code, not why: the CANN lines that follow it say why."""
    if cause.pattern is not None:
        return cause.pattern.family in GENERIC_FAMILIES
    return cause.kind in ("plog_error", "runtime_error", "cann_code") or GENERIC_WORDS.search(cause.line) is not None


def failure_class(cause: Cause) -> str:
    """Whose problem the cause is: its family's class; for a line no family knows, configuration when the engine
    refused its arguments or configuration (argparse, pydantic, a `validate…`/`…_args`/`…config` function raised
    it), else the engine's."""
    if cause.pattern is not None and cause.pattern.failure_class is not None:
        return cause.pattern.failure_class
    refused = cause.kind == "argparse" or cause.exception in CONFIG_TYPES
    if refused or (cause.raised_in is not None and CONFIG_FUNCTIONS.search(cause.raised_in)):
        return "configuration"
    return "engine"


def _candidates(lines: Sequence[str], patterns: Patterns) -> list[_Candidate]:
    found: list[_Candidate] = []
    state = _State()
    for index, raw in enumerate(lines):
        who, body = split_prefix(raw)
        reading = state.open.get(who)
        if reading is not None and _in_traceback(reading, body, index, found, state, who, raw):
            continue
        if body.strip() == TRACEBACK:
            chained = state.last_exception.get(who) if state.chain_next.pop(who, False) else None
            state.open[who] = _Traceback(index, chained_to=chained)
            continue
        if body.strip() in CHAINED:
            state.chain_next[who] = True
            continue
        single = _single(raw, body, index, patterns)
        if single is not None:
            found.append(single)
    return sorted(found, key=lambda c: c.start)


def _in_traceback(
    reading: _Traceback, body: str, index: int, found: list[_Candidate], state: _State, who: str, raw: str
) -> bool:
    """Feed one line of a process's open traceback; False when the line is not the traceback's any more."""
    if reading.frames:
        if body[:1].isspace() or body == "":
            frame = FRAME.match(body)
            reading.function = frame.group("function") if frame else reading.function
            return True
        exception = EXCEPTION.match(body.strip())
        del state.open[who]
        if exception is None:  # the traceback was cut short: this line is someone else's
            return False
        cause = _exception_cause(raw, index, exception, reading.function)
        if reading.chained_to is not None:  # the root stays the chain's first; this one is its consequence
            reading.chained_to.end = index
            state.last_exception[who] = reading.chained_to
            return True
        candidate = _Candidate(reading.start, index, cause)
        found.append(candidate)
        state.last_exception[who] = candidate
        if exception.group("type").endswith("ValidationError"):  # its message goes on below: "Value error, …"
            state.open[who] = _Traceback(index, detail_of=candidate, frames=False)
        return True
    target = reading.detail_of
    if target is not None and body.strip() and len(target.cause.detail) < MAX_DETAIL and body.strip() != TRACEBACK:
        target.cause = _with_detail(target.cause, body.strip())
        target.end = index
        return True
    del state.open[who]
    return False


def _with_detail(cause: Cause, text: str) -> Cause:
    return dataclasses.replace(cause, detail=(*cause.detail, text[:MAX_EVENT_LINE]))


def _exception_cause(raw: str, index: int, exception: re.Match[str], function: str | None) -> Cause:
    kind = exception.group("type").rsplit(".", 1)[-1]
    message = exception.group("message") or ""
    consequence = kind in CONSEQUENCE_TYPES or CONSEQUENCE_WORDS.search(message) is not None
    return Cause(_kept(raw), index + 1, "exception", kind, None, consequence, raised_in=function)


def _single(raw: str, body: str, index: int, patterns: Patterns) -> _Candidate | None:
    """A one-line candidate: a fatal pattern's line, or a CANN code, plog, runtime or argparse error line."""
    line = strip_ansi(raw)
    if any(quoting.regex.search(line) for quoting in patterns.user_text):
        return None  # a request's own text, quoted by the request logger
    fatal = next((p for p, _ in patterns.match(line) if p.kind == "fatal"), None)
    if fatal is not None:
        return _Candidate(index, index, Cause(_kept(raw), index + 1, "pattern", None, fatal, fatal.consequence))
    exception = EXCEPTION.match(body.strip())
    if exception is not None and exception.group("type").endswith(("Error", "Exception")):  # logged, no traceback
        return _Candidate(index, index, _exception_cause(raw, index, exception, None))
    for kind, regex in (("plog_error", PLOG_ERROR), ("runtime_error", RUNTIME_ERROR), ("argparse", ARGPARSE)):
        if regex.search(body):
            return _Candidate(index, index, Cause(_kept(raw), index + 1, kind))
    if CANN_CODE.search(body) and re.search(r"[Ee]rror|ERROR|[Ff]ail", body):
        return _Candidate(index, index, Cause(_kept(raw), index + 1, "cann_code"))
    return None


def _kept(raw: str) -> str:
    return strip_ansi(raw).strip()[:MAX_EVENT_LINE]
