"""Text formats of the console tools, as Kafka's: the producer's line reader (LineMessageReader), the
consumer's record formatter (DefaultMessageFormatter), their `--property` settings, and timestamps
given as milliseconds or ISO 8601 datetimes. Pure functions, no I/O.

Producer properties: parse.key (false), key.separator (tab), parse.headers (false), headers.delimiter
(tab), headers.separator (","), headers.key.separator (":"), ignore.error (false), null.marker (none).
A line with headers reads `h1:v1,h2:v2<headers.delimiter>key<key.separator>value`.

Consumer properties: print.timestamp, print.partition, print.offset, print.headers, print.key (false),
print.value (true), key.separator (tab), line.separator (newline), headers.separator (","),
headers.key.separator (":"), null.literal ("null").
"""

from __future__ import annotations

import base64
import datetime as dt
from dataclasses import dataclass

TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


class FormatError(ValueError):
    """A line or a property that cannot be used; the message says which and why."""


def _bool(props: dict, key: str, default: bool) -> bool:
    v = props.get(key)
    if v is None:
        return default
    s = v.strip().lower()
    if s not in ("true", "false"):
        raise FormatError(f"property {key} must be true or false, not {v!r}")
    return s == "true"


def _unescape(s: str) -> str:
    """`\\t`, `\\n` and friends as typed on a command line."""
    return s.encode("latin-1", "backslashreplace").decode("unicode_escape") if "\\" in s else s


# ------------------------------------------------------------------------------------------ producer
PRODUCER_PROPERTIES = ("parse.key", "key.separator", "parse.headers", "headers.delimiter", "headers.separator",
                       "headers.key.separator", "ignore.error", "null.marker")


@dataclass(frozen=True)
class LineReader:
    parse_key: bool = False
    key_separator: bytes = b"\t"
    parse_headers: bool = False
    headers_delimiter: bytes = b"\t"
    headers_separator: bytes = b","
    headers_key_separator: bytes = b":"
    ignore_error: bool = False
    null_marker: bytes | None = None

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> "LineReader":
        unknown = sorted(set(props) - set(PRODUCER_PROPERTIES))
        if unknown:
            raise FormatError(f"unknown --property {', '.join(unknown)} (known: {', '.join(PRODUCER_PROPERTIES)})")

        def sep(key: str, default: str) -> bytes:
            v = _unescape(props.get(key, default))
            if not v:
                raise FormatError(f"property {key} must not be empty")
            return v.encode()
        marker = props.get("null.marker")
        return cls(_bool(props, "parse.key", False), sep("key.separator", "\t"), _bool(props, "parse.headers", False),
                   sep("headers.delimiter", "\t"), sep("headers.separator", ","), sep("headers.key.separator", ":"),
                   _bool(props, "ignore.error", False), None if marker is None else _unescape(marker).encode())

    def _null(self, b: bytes) -> bytes | None:
        return None if self.null_marker is not None and b == self.null_marker else b

    def parse(self, line: bytes, number: int) -> tuple[bytes | None, bytes | None, list]:
        """(key, value, headers) of one line (without its line ending)."""
        headers: list = []
        rest = line
        if self.parse_headers:
            i = rest.find(self.headers_delimiter)
            if i < 0:
                if not self.ignore_error:
                    raise FormatError(f"no headers delimiter {self.headers_delimiter.decode()!r} on line {number}")
            else:
                headers = self._headers(rest[:i], number)
                rest = rest[i + len(self.headers_delimiter):]
        key = None
        if self.parse_key:
            i = rest.find(self.key_separator)
            if i < 0:
                if not self.ignore_error:
                    raise FormatError(f"no key separator {self.key_separator.decode()!r} on line {number}")
            else:
                key, rest = self._null(rest[:i]), rest[i + len(self.key_separator):]
        return key, self._null(rest), headers

    def _headers(self, text: bytes, number: int) -> list:
        out = []
        for pair in text.split(self.headers_separator):
            if not pair:
                continue
            i = pair.find(self.headers_key_separator)
            if i < 0:
                if not self.ignore_error:
                    raise FormatError(f"no header key separator {self.headers_key_separator.decode()!r} in "
                                      f"{pair.decode(errors='replace')!r} on line {number}")
                out.append((pair.decode("utf-8", "replace"), None))
                continue
            name = pair[:i]
            if self.null_marker is not None and name == self.null_marker:
                raise FormatError(f"a header key on line {number} is the null marker; header keys cannot be null")
            out.append((name.decode("utf-8", "replace"), self._null(pair[i + len(self.headers_key_separator):])))
        return out


# ------------------------------------------------------------------------------------------ consumer
CONSUMER_PROPERTIES = ("print.timestamp", "print.partition", "print.offset", "print.headers", "print.key",
                       "print.value", "key.separator", "line.separator", "headers.separator",
                       "headers.key.separator", "null.literal")


@dataclass(frozen=True)
class RecordFormatter:
    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_headers: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    headers_separator: bytes = b","
    headers_key_separator: bytes = b":"
    null_literal: bytes = b"null"

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> "RecordFormatter":
        unknown = sorted(set(props) - set(CONSUMER_PROPERTIES))
        if unknown:
            raise FormatError(f"unknown --property {', '.join(unknown)} (known: {', '.join(CONSUMER_PROPERTIES)})")

        def text(key: str, default: str) -> bytes:
            return _unescape(props.get(key, default)).encode()
        return cls(_bool(props, "print.timestamp", False), _bool(props, "print.partition", False),
                   _bool(props, "print.offset", False), _bool(props, "print.headers", False),
                   _bool(props, "print.key", False), _bool(props, "print.value", True), text("key.separator", "\t"),
                   text("line.separator", "\n"), text("headers.separator", ","), text("headers.key.separator", ":"),
                   text("null.literal", "null"))

    def format(self, r) -> bytes:
        """One record as Kafka's console consumer prints it, line separator included."""
        fields: list[bytes] = []
        if self.print_timestamp:
            name = TIMESTAMP_TYPES.get(r.timestamp_type)
            fields.append(f"{name}:{r.timestamp}".encode() if name and r.timestamp >= 0 else b"NO_TIMESTAMP")
        if self.print_partition:
            fields.append(b"Partition:%d" % r.partition)
        if self.print_offset:
            fields.append(b"Offset:%d" % r.offset)
        if self.print_headers:
            fields.append(self.headers_separator.join(
                k.encode() + self.headers_key_separator + self._bytes(v) for k, v in r.headers) or b"NO_HEADERS")
        if self.print_key:
            fields.append(self._bytes(r.key))
        if self.print_value:
            fields.append(self._bytes(r.value))
        return self.key_separator.join(fields) + self.line_separator

    def _bytes(self, b) -> bytes:
        return self.null_literal if b is None else bytes(b)


def json_bytes(b):
    """A key, value or header value in JSON: text when it is UTF-8, else {"base64": ...}."""
    if b is None:
        return None
    b = bytes(b)
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode()}


def record_json(r) -> dict:
    return {"topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
            "timestamp_type": TIMESTAMP_TYPES.get(r.timestamp_type, "NoTimestampType"), "key": json_bytes(r.key),
            "value": json_bytes(r.value), "headers": [[k, json_bytes(v)] for k, v in r.headers]}


# ------------------------------------------------------------------------------------------ time
def parse_timestamp(text: str, now: dt.datetime | None = None) -> int:
    """Milliseconds since the epoch, from an integer or an ISO 8601 datetime (local time unless the
    text names a zone, as Kafka's tools read --to-datetime)."""
    s = text.strip()
    if s.lstrip("-").isdigit():
        return int(s)
    try:
        when = dt.datetime.fromisoformat(s)
    except ValueError:
        raise FormatError(f"not a timestamp in ms or an ISO 8601 datetime: {text!r}") from None
    if when.tzinfo is None:
        when = when.astimezone()   # the local zone
    return int(when.timestamp() * 1000)
