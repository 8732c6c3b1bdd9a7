"""Kafka's properties files (`server.properties`, a tool's `--command-config`, a client's config
file), read as Kafka reads them: with `java.util.Properties.load`.

One reader serves `odradek serve --config` and every tool's `--command-config`, so one file means the
same to both (issue 34: the tools had a weaker parser of their own). The rules of `Properties.load`:
`#` and `!` start a comment line; a key ends at the first unescaped `=`, `:` or white space, and the
separator may be white space alone (`key value`); white space after the separator is dropped; a line
ending in an odd number of backslashes continues on the next, whose leading white space is dropped;
`\\t \\n \\r \\f \\uXXXX` are escapes and any other escaped character stands for itself (`\\=`, `\\:`,
`\\ `, `\\\\`); a later key wins. Files are UTF-8, or ISO-8859-1 (Java's own encoding) when not.

Written here rather than taken from `jproperties`: that library keeps comments, metadata and order for
rewriting files, which nothing here needs, and the rules above are some eighty lines with tests (in
tests/unit/test_config.py and tests/unit/cli) where a dependency would add an install for every user.
This module imports nothing of odradek, so any layer may use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

__all__ = ["load_properties", "parse_properties"]


_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java properties text: `#`/`!` comments, `key=value`, `key: value`, `key value`,
    backslash line continuations and escapes (`\\t`, `\\n`, `\\uXXXX`, `\\=`, ...). Later keys win.
    """
    result: dict[str, str] = {}
    for logical in _logical_lines(text):
        key, value = _split_key_value(logical)
        result[_unescape(key)] = _unescape(value)
    return result


def _logical_lines(text: str) -> Iterator[str]:
    lines = re.split(r"\r\n|\r|\n", text)
    index = 0
    while index < len(lines):
        line = lines[index].lstrip(_WHITESPACE)
        index += 1
        if not line or line[0] in "#!":
            continue  # a comment never continues onto the next line
        parts = []
        while _continues(line) and index < len(lines):
            parts.append(line[:-1])
            line = lines[index].lstrip(_WHITESPACE)
            index += 1
        if _continues(line):  # a continuation on the last line continues into nothing
            line = line[:-1]
        parts.append(line)
        yield "".join(parts)


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split_key_value(line: str) -> tuple[str, str]:
    index, length = 0, len(line)
    while index < length:
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char in "=:" or char in _WHITESPACE:
            break
        index += 1
    key = line[:index]
    rest = line[index:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WHITESPACE)
    return key, rest


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    index, length = 0, len(text)
    while index < length:
        char = text[index]
        index += 1
        if char != "\\" or index >= length:
            if char != "\\":
                out.append(char)
            continue
        escaped = text[index]
        index += 1
        if escaped == "u":
            digits = text[index:index + 4]
            if not re.fullmatch(r"[0-9A-Fa-f]{4}", digits):
                raise ValueError(f"Malformed \\uxxxx encoding in {text!r}")
            out.append(chr(int(digits, 16)))
            index += 4
        else:
            out.append(_ESCAPES.get(escaped, escaped))
    return "".join(out)


def load_properties(path: str | Path) -> dict[str, str]:
    """Read a properties file. UTF-8, falling back to ISO-8859-1 (Java's own encoding) if it is not."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("iso-8859-1")
    return parse_properties(text.removeprefix("\ufeff"))
