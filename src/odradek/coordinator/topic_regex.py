"""Subscription regexes of the consumer group protocol (seed 002, KIP-848 `SubscribedTopicRegex`), compiled
and matched as Kafka does it, in time linear in the name and bounded memory.

Kafka's GroupMetadataManager compiles a member's regex with RE2/J (`Pattern.compile`), answers a pattern
it refuses with INVALID_REGULAR_EXPRESSION ("SubscribedTopicRegex `...` is not a valid regular expression:
..."), and resolves it against the topics with `pattern.matcher(topic).matches()`: the whole name must
match. The same here through RE2 (the `google-re2` binding): RE2's syntax, no backreferences or
lookaround, and matching by automaton instead of backtracking, so `(a+)+` against a name of 249 `a`s
costs what any other regex does.

RE2/J has no limits; these are odradek's, to keep compiling and matching bounded (a compile holds the
interpreter and cannot be interrupted, so its cost is bounded before it starts):

- `MAX_REGEX_BYTES` (4 KiB of UTF-8) per pattern: a longer one is refused without being parsed (or
  echoed back in the error message);
- at most `MAX_REPEAT_TOTAL` (1000, RE2's own bound for one counted repetition) summed over the bounds of
  all counted repetitions (`{n}`, `{n,}`, `{n,m}`), and at most `MAX_UNICODE_CLASSES` Unicode class escapes
  (`\\p`, `\\P`): these are what makes RE2's compile cost grow faster than the pattern (a{1,249} thirty
  times took 0.3 s, \\pL a thousand times 0.2 s);
- `MAX_PROGRAM_BYTES` (RE2's `max_mem`, 128 KiB) for the compiled program and its automaton caches:
  a larger program is refused ("pattern too large"), and a regex whose automaton outgrows its cache
  falls back to RE2's NFA, still linear in the name;
- at most `MAX_PROGRAM_SIZE` (8192) instructions in the compiled program: RE2's NFA costs about the
  name's length times the program's size, so one name of 249 characters is matched in some tens of
  milliseconds at worst (a topic list of 4 KiB of names and prefixes compiles to under 2,000); RE2's
  own limit under `MAX_PROGRAM_BYTES` is about the same, so a larger program is refused while it is
  being built.

Within these bounds the slowest of some 50,000 generated patterns (classes, Unicode classes, nested
and counted repetitions, alternations) compiled in about 20-35 ms, on a loaded machine.

Matching many names is done in slices (`match_in_slices`): a generator that yields after about
`SLICE_STEPS` units of work, estimated per name as its length times the program's size (RE2's worst
case, the NFA, costs about that), so the caller can give the event loop back between slices. Compiled
patterns are cached (at most `COMPILED_CACHE` of them here, with two programs each, and the 128 programs
the binding keeps, each within `MAX_PROGRAM_BYTES`: 32 MiB at most).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import re2  # type: ignore[import-untyped]

MAX_REGEX_BYTES = 4096
MAX_REPEAT_TOTAL = 1000
MAX_UNICODE_CLASSES = 16
MAX_PROGRAM_BYTES = 128 * 1024
MAX_PROGRAM_SIZE = 8192
MAX_CAUSE_CHARS = 200
COMPILED_CACHE = 64
SLICE_STEPS = 250_000            # about 1-10 ms of matching, depending on how well RE2's DFA does
CALL_STEPS = 1000                # the fixed cost of a name (a call, or a match object), in the same units

_REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")
_UNICODE_CLASS = re.compile(r"\\[pP]")


class RegexError(ValueError):
    """A subscription regex refused; `str()` is the error message for the client."""


_NOT_YET = object()


@dataclass
class TopicRegex:
    """A compiled subscription regex: `matches(name)` is RE2/J's `matcher(name).matches()`; `select`
    the names of a list that match, in one pass over them where it can (`lines_form`)."""
    regex: str
    program_size: int
    _compiled: Any
    _lines: Any = _NOT_YET

    def matches(self, name: str) -> bool:
        return self._compiled.fullmatch(name) is not None

    def cost(self, name: str) -> int:
        """The estimated work of matching `name`, in `SLICE_STEPS` units."""
        return CALL_STEPS + len(name) * self.program_size

    def lines_form(self) -> Any:
        """The one-pass form (`_lines_form`), compiled on first use: a heartbeat that only validates the
        regex compiles one program, not two."""
        if self._lines is _NOT_YET:
            self._lines = _lines_form(self.regex)
        return self._lines

    def select(self, names: list[str]) -> list[str]:
        """The names that `matches` accepts, in order."""
        lines = self.lines_form() if names else None
        if lines is None:
            return [n for n in names if self.matches(n)]
        text = "\n".join(names).encode("utf-8", "surrogatepass")
        if text.count(b"\n") != len(names) - 1:      # a name with a newline: no topic has one
            return [n for n in names if self.matches(n)]
        return [m.group().decode("utf-8", "surrogatepass") for m in lines.finditer(text)]


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False          # errors are answered to the client, not written to stderr
    options.max_mem = MAX_PROGRAM_BYTES
    return options


_OPTIONS = _options()


def _lines_options() -> Any:
    options = _options()
    options.never_nl = True             # no match crosses a newline: each is within one name
    options.never_capture = True
    return options


_LINES_OPTIONS = _lines_options()
_TEXT_ANCHORS = re.compile(r"\\[AzC]|\(\?[a-zA-Z]*-")   # \A, \z, any byte, or a flag turned off: (?-m)


def _lines_form(regex: str) -> Any:
    """`regex` as a search over names joined by newlines that finds exactly the names it matches whole:
    `(?m)^(?:regex)$`, never matching a newline, so every match is one whole line. Matching a list of
    names is then one pass in RE2 with Python work only per match, instead of a call per name (100,000
    names against `orders-.*`: 0.5 s instead of 2.6; against a regex matching few, 30 ms instead of 1 s).
    None where the forms could differ (the regex's own text anchors, or multi-line mode turned off
    inside it) or where the form does not compile within the bounds; names are then matched one by one."""
    if _TEXT_ANCHORS.search(regex):
        return None
    try:
        lines = re2.compile(f"(?m)^(?:{regex})$", _LINES_OPTIONS)
    except re2.error:
        return None
    return lines if lines.programsize <= MAX_PROGRAM_SIZE else None


def _invalid(regex: str, why: str) -> RegexError:
    return RegexError(f"SubscribedTopicRegex `{regex}` is not a valid regular expression: {why}.")


def _bound(m: re.Match) -> int:
    digits = m.group(2) or m.group(1)            # {n}, {n,}: n; {n,m}: m
    return int(digits) if len(digits) <= 6 else MAX_REPEAT_TOTAL + 1


def check_bounds(regex: str) -> None:
    """Refuse, before compiling, a pattern outside odradek's bounds (see the module doc)."""
    size = len(regex) if len(regex) > MAX_REGEX_BYTES else len(regex.encode("utf-8", "surrogatepass"))
    if size > MAX_REGEX_BYTES:
        raise RegexError(f"SubscribedTopicRegex is too long ({len(regex)} characters): at most "
                         f"{MAX_REGEX_BYTES} bytes of UTF-8 are accepted.")
    repeats = sum(_bound(m) for m in _REPEAT.finditer(regex))
    if repeats > MAX_REPEAT_TOTAL:
        raise _invalid(regex, f"its counted repetitions add up to {repeats}, more than the "
                              f"{MAX_REPEAT_TOTAL} accepted")
    classes = len(_UNICODE_CLASS.findall(regex))
    if classes > MAX_UNICODE_CLASSES:
        raise _invalid(regex, f"it has {classes} Unicode classes (\\p, \\P), more than the "
                              f"{MAX_UNICODE_CLASSES} accepted")


@functools.lru_cache(maxsize=COMPILED_CACHE)
def compile_regex(regex: str) -> TopicRegex:
    """`regex` compiled with RE2's syntax, or RegexError with the message Kafka gives (the cause as RE2
    words it). Cached: a heartbeat validates the same regex its members keep sending."""
    check_bounds(regex)
    try:
        compiled = re2.compile(regex, _OPTIONS)
    except re2.error as e:
        why = e.args[0] if e.args else "refused"
        cause = why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
        raise _invalid(regex, cause[:MAX_CAUSE_CHARS]) from None      # RE2's cause may quote all of it
    except UnicodeEncodeError as e:
        raise _invalid(regex, f"it is not valid UTF-8 ({e.reason})") from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise _invalid(regex, f"pattern too large: it compiles to {compiled.programsize} instructions, more than "
                              f"the {MAX_PROGRAM_SIZE} accepted")
    return TopicRegex(regex, compiled.programsize, compiled)


def match_in_slices(pattern: TopicRegex, names: Iterable[str], found: list[str],
                    budget: int = SLICE_STEPS) -> Iterator[None]:
    """Append to `found` each of `names` that `pattern` matches whole, in order, yielding between slices
    of about `budget` units of work (never after the last), so a caller can let others run between them."""
    chunk: list[str] = []
    spent = 0
    for name in names:
        if spent >= budget:
            found.extend(pattern.select(chunk))
            chunk, spent = [], 0
            yield
        chunk.append(name)
        spent += pattern.cost(name)
    found.extend(pattern.select(chunk))


def matching(pattern: TopicRegex, names: Iterable[str]) -> list[str]:
    """Every name `pattern` matches whole, in one go (for a caller that has already bounded `names`)."""
    found: list[str] = []
    for _ in match_in_slices(pattern, names, found):
        pass
    return found
