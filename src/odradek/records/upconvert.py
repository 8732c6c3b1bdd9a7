"""A produced legacy message set (magic 0 or 1) streamed into one v2 batch, as Kafka's LogValidator
converts it before appending (Kafka 3+ stores only v2; seed 004, "Message sets"; layouts: `legacy`).

Accepted shapes, as Kafka accepts them: any number of uncompressed messages of one magic, or exactly
one compressed wrapper and nothing else ("Compressed outer record has more than one batch"). The
output is one v2 batch with offset deltas 0..n-1 (the log assigns the real offsets; magic 1 inner
offsets, which old clients got wrong, are not used), CreateTime, the records' timestamps (-1,
NO_TIMESTAMP, for magic 0), no producer id, and the wrapper's codec (uncompressed for a plain set).

Checks, and what they raise (the broker maps them to error codes):
- framing, sizes, inner magic differing from the wrapper's, mixed magics: InvalidRecordError
  (INVALID_RECORD), or ProtocolError for truncation (CORRUPT_MESSAGE);
- every message's CRC-32, the wrapper's and each inner message's: ProtocolError (CORRUPT_MESSAGE);
- a codec that magic 0/1 cannot carry: UnsupportedCodecError;
- inflation past `max_uncompressed_bytes`: DecompressionLimitError;
- per record, collected as in `scan` (KIP-467): a null key when keys are required, a timestamp out of
  range, a LogAppendTime timestamp type (producers may not set it), an inner message that is itself
  compressed.

Memory: the inflated wrapper (at most `max_uncompressed_bytes`) plus the v2 records written into one
growing buffer, which is never larger than the legacy messages it comes from. Messages are read in a
loop that keeps no object per record; the loop stops appending at the first record error and only
counts the rest.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.builder import RecordBatchBuilder
from odradek.records.legacy import (
    COMPRESSION_MASK, KEY_LENGTH_OFFSET, LOG_OVERHEAD, MAGIC_OFFSET, MIN_SIZE, TIMESTAMP_TYPE_MASK,
)
from odradek.records.scan import KEY_ERROR, TIMESTAMP_ERROR, InvalidRecordError, RecordRules

COMPRESSION_ERROR = 3      # a compressed message inside a compressed wrapper
LOG_APPEND_TIME_ERROR = 4  # a producer's message claiming the LogAppendTime timestamp type

_ENTRY = struct.Struct(">qiIbb")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_ENTRY_MIN = LOG_OVERHEAD + 6  # offset, size, crc, magic, attributes


class UnsupportedCodecError(ProtocolError):
    """A compression codec the message's magic cannot carry (or no codec at all)."""


@dataclass
class Conversion:
    batch: bytes | None        # the v2 batch; None when any record failed
    count: int
    magic: int
    codec: int
    errors: list[tuple[int, int]] = field(default_factory=list)
    error_count: int = 0


def legacy_to_v2_batch(buf, rules: RecordRules, *, max_uncompressed_bytes: int) -> Conversion:
    """Convert a produced legacy message set (see the module docstring)."""
    view = memoryview(buf).cast("B")
    end = len(view)
    _, size, crc, magic, attributes = _entry(view, 0, end)
    codec = attributes & COMPRESSION_MASK
    if codec:
        if LOG_OVERHEAD + size != end:
            raise InvalidRecordError("Compressed outer record has more than one batch")
        if codec not in codecs.LEGACY_CODECS:
            raise UnsupportedCodecError(f"compression codec {codec} is invalid with magic {magic}")
        _check_crc(view, 0, end, crc)
        value_at, value_end = _value(view, 0, end, magic)
        if value_at < 0:
            raise InvalidRecordError("compressed legacy message has a null value")
        inner = codecs.decompress(codec, view[value_at:value_end], max_bytes=max_uncompressed_bytes)
        log_append_time = magic == 1 and bool(attributes & TIMESTAMP_TYPE_MASK)
        out = _Writer(codec, rules)
        _convert(memoryview(inner), magic, out, log_append_time, inner=True)
        if out.count == 0:
            raise InvalidRecordError("compressed legacy message with no inner messages")
    else:
        out = _Writer(codecs.NONE, rules)
        _convert(view, magic, out, False, inner=False)
    return out.result(magic)


class _Writer:
    """Appends converted records to one v2 builder and collects per-record errors."""

    def __init__(self, codec: int, rules: RecordRules) -> None:
        self.codec = codec
        self.rules = rules
        self.low = rules.timestamp_min
        self.high = rules.timestamp_max
        self.builder: RecordBatchBuilder | None = RecordBatchBuilder(compression=codec)
        self.count = 0
        self.errors: list[tuple[int, int]] = []
        self.error_count = 0

    def add(self, key, value, timestamp: int, log_append_time: bool, compressed: bool) -> None:
        i = self.count
        self.count += 1
        kind = 0
        if compressed:
            kind = COMPRESSION_ERROR
        elif self.rules.keys_required and key is None:
            kind = KEY_ERROR
        elif log_append_time:
            kind = LOG_APPEND_TIME_ERROR
        elif timestamp != -1 and ((self.low is not None and timestamp < self.low)
                                  or (self.high is not None and timestamp > self.high)):
            kind = TIMESTAMP_ERROR
        if kind:
            if self.error_count < self.rules.max_errors:
                self.errors.append((i, kind))
            self.error_count += 1
            self.builder = None  # nothing will be appended: free what was built
        elif self.builder is not None:
            self.builder.append_plain(key, value, timestamp)

    def result(self, magic: int) -> Conversion:
        batch = None if self.builder is None or self.error_count else self.builder.build()
        return Conversion(batch, self.count, magic, self.codec, self.errors, self.error_count)


def _entry(view: memoryview, pos: int, end: int) -> tuple[int, int, int, int, int]:
    if end - pos < _ENTRY_MIN:
        raise ProtocolError("legacy message shorter than its header")
    offset, size, crc, magic, attributes = _ENTRY.unpack_from(view, pos)
    if magic not in (0, 1):
        raise InvalidRecordError(f"legacy message magic {magic}, expected 0 or 1")
    if size < MIN_SIZE[magic]:
        raise InvalidRecordError(f"legacy message size {size} below the minimum {MIN_SIZE[magic]}")
    if size > end - pos - LOG_OVERHEAD:
        raise ProtocolError("legacy message truncated")
    return offset, size, crc, magic, attributes


def _check_crc(view: memoryview, pos: int, entry_end: int, crc: int) -> None:
    computed = zlib.crc32(view[pos + MAGIC_OFFSET:entry_end])
    if computed != crc:
        raise ProtocolError(f"legacy message is corrupt: stored crc {crc:#010x}, computed {computed:#010x}")


def _value(view: memoryview, pos: int, entry_end: int, magic: int) -> tuple[int, int]:
    """(start, end) of the message's value, start -1 for null; key and value must fill the message."""
    key_at = pos + KEY_LENGTH_OFFSET[magic]
    key_length = _I32.unpack_from(view, key_at)[0]
    value_length_at = key_at + 4 + max(key_length, 0)
    if key_length < -1 or value_length_at + 4 > entry_end:
        raise InvalidRecordError(f"legacy message key length {key_length} is invalid")
    value_length = _I32.unpack_from(view, value_length_at)[0]
    if value_length < -1 or value_length_at + 4 + max(value_length, 0) != entry_end:
        raise InvalidRecordError("legacy message key and value do not fill the message")
    start = value_length_at + 4
    return (start, entry_end) if value_length >= 0 else (-1, -1)


def _convert(view: memoryview, magic: int, out: _Writer, log_append_time: bool, inner: bool) -> None:
    """Every message of view, appended to out; inner: the messages of a wrapper."""
    pos, end = 0, len(view)
    key_length_offset = KEY_LENGTH_OFFSET[magic]
    while pos < end:
        _, size, crc, m, attributes = _entry(view, pos, end)
        entry_end = pos + LOG_OVERHEAD + size
        if m != magic:
            raise InvalidRecordError(f"message magic {m} differs from the first message's magic {magic}")
        if attributes & COMPRESSION_MASK and not inner:
            raise InvalidRecordError("Compressed outer record has more than one batch")
        _check_crc(view, pos, entry_end, crc)
        key_at = pos + key_length_offset
        key_length = _I32.unpack_from(view, key_at)[0]
        value_at, value_end = _value(view, pos, entry_end, magic)
        key = None if key_length < 0 else view[key_at + 4:key_at + 4 + key_length].tobytes()
        value = None if value_at < 0 else view[value_at:value_end].tobytes()
        timestamp = _I64.unpack_from(view, pos + 18)[0] if magic else -1
        lat = log_append_time or (magic == 1 and not inner and bool(attributes & TIMESTAMP_TYPE_MASK))
        out.add(key, value, timestamp, lat, bool(attributes & COMPRESSION_MASK))
        pos = entry_end
