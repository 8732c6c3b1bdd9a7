"""Validation of a produced record set before it reaches the log, as Kafka's LogValidator (with
UnifiedLog's analyzeAndValidateRecords and ProduceRequest's own checks) does it: seed 003, "The
Producer"; KIP-467 for per-record errors. A header is never trusted on its own (DESIGN, "Performance
principles").

Checks in order, each with Kafka's error code:
1. The set: at least one entry (INVALID_RECORD); every entry framed by its 12-byte prefix, a
   truncated one is CORRUPT_MESSAGE; magic 0, 1 or 2 (else CORRUPT_MESSAGE). Produce v3+ carries
   exactly one entry, of magic 2 (INVALID_RECORD). Whatever the request version a v2 set is one batch,
   and a compressed legacy set one wrapper (INVALID_RECORD); magics are not mixed (INVALID_RECORD).
2. Each entry: at most `max.message.bytes` (MESSAGE_TOO_LARGE); its CRC (CORRUPT_MESSAGE).
3. The v2 header: base_offset 0, records_count > 0 and equal to last_offset_delta + 1, not a
   control batch, a producer id only with a base sequence (INVALID_RECORD); a codec id in 0..4 and
   zstd only from Produce v7 (UNSUPPORTED_COMPRESSION_TYPE); no LogAppendTime timestamp type, which
   is the broker's to set (INVALID_TIMESTAMP: Kafka refuses it on LogAppendTime topics and on
   CreateTime topics would store a max_timestamp the records do not have, so it is refused on both).
4. Every record (`odradek.records.scan`): framing, lengths and offset deltas, and records_count equal
   to the records present (INVALID_RECORD). Null keys on compacted topics and CreateTime timestamps
   outside [now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms] are listed
   per record (KIP-467 `record_errors`, the first `scan.DEFAULT_MAX_ERRORS` of them); the partition's
   error is then INVALID_TIMESTAMP if a listed record's timestamp is wrong, else INVALID_RECORD.
5. A compressed batch or wrapper inflates to at most `max_uncompressed_bytes(max.message.bytes)`
   and declares no more records than that could hold (MESSAGE_TOO_LARGE; Kafka has no such bound,
   but a broker that inflates what it is sent must bound it). Undecodable compressed data is
   CORRUPT_MESSAGE.

The result is a writable buffer holding one v2 batch whose max_timestamp is true: the records'
largest timestamp on CreateTime topics (rewritten, CRC included, when the header said otherwise, as
Kafka's setMaxTimestamp does), `now` on LogAppendTime topics. Legacy sets are converted
(`records.upconvert`); the converted batch must fit max.message.bytes, as in Kafka.

Cost: entry framing, header fields and CRC are C speed; the record scan is vectorised for batches of
many records (some 50 ns a record for a producer's batch of equal-size records). The produce handler
validates on the event loop within a budget, `validate(..., inline=True)`: sets up to
INLINE_MAX_BYTES and INLINE_MAX_RECORDS, compressed ones inflating to at most INLINE_INFLATE_MAX, at
most INLINE_LOOP_MAX records or headers checked one at a time (records of varied sizes, many
headers), legacy sets up to LEGACY_INLINE_MAX_BYTES (converted message by message). Past the budget,
`NeedsWorker` is raised before anything is changed, and the handler validates on the worker pool
(`needs_worker` tells it so at once from the size). Measured, a worker costs twice the CPU of the
loop for a batch that fits the budget: numpy hands the GIL back and forth with the loop thread on
every call. This module does no I/O and keeps no state, so it runs on any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.header import (
    HEADER_SIZE, LOG_OVERHEAD, MAGIC_OFFSET, BatchHeader, peek_offset_and_length, set_max_timestamp,
)
from odradek.records.scan import (
    DEFAULT_MAX_ERRORS, KEY_ERROR, MIN_BODY_SIZE, TIMESTAMP_ERROR, InvalidRecordError, LoopBudget,
    LoopBudgetExceeded, RecordRules, scan_records,
)
from odradek.records.upconvert import (
    COMPRESSION_ERROR, LOG_APPEND_TIME_ERROR, UnsupportedCodecError, legacy_to_v2_batch,
)
from odradek.records.varint import INT64_MAX, INT64_MIN
from odradek.server.config import TopicConfig

CREATE_TIME = 0
LOG_APPEND_TIME = 1
INFLATION_MAX = 16                         # inflated bytes allowed per byte of max.message.bytes
UNCOMPRESSED_CEILING = 64 * 1024 * 1024    # ... up to this, unless max.message.bytes is larger
INLINE_MAX_BYTES = 2 * 1024 * 1024         # larger sets are validated on the worker pool
INLINE_INFLATE_MAX = 64 * 1024             # inline, a compressed v2 batch may inflate this far
INLINE_LOOP_MAX = 2048                     # inline, records or headers checked one at a time
INLINE_MAX_RECORDS = 32 * 1024             # inline, records in a batch (vectorised: some 50 ns each)
LEGACY_INLINE_MAX_BYTES = 8 * 1024         # inline, a legacy set (converted per message) may be this big
ZSTD_MIN_PRODUCE_VERSION = 7

_RECORD_ERROR_TEXT = {
    KEY_ERROR: "Compacted topic cannot accept a record without a key",
    COMPRESSION_ERROR: "A compressed wrapper may not hold a compressed inner message",
    LOG_APPEND_TIME_ERROR: "Producers may not set the timestamp type to LogAppendTime",
}


class NeedsWorker(Exception):
    """Validating inline would pass the inline budget: validate on the worker pool instead."""


class InvalidRecords(Exception):
    """The partition's records are refused: error code, message and KIP-467 record errors."""

    def __init__(self, error: ErrorCode, message: str,
                 record_errors: list[tuple[int, str | None]] | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.record_errors = record_errors or []


@dataclass
class TopicRules:
    max_message_bytes: int
    timestamp_type: int                  # CREATE_TIME or LOG_APPEND_TIME
    timestamp_before_max_ms: int
    timestamp_after_max_ms: int
    compacted: bool
    max_errors: int = field(default=DEFAULT_MAX_ERRORS)


def topic_rules(tc: TopicConfig) -> TopicRules:
    """The checks a topic's effective config asks of the records produced to it."""
    return TopicRules(
        max_message_bytes=tc.get_value("max.message.bytes"),
        timestamp_type=LOG_APPEND_TIME if tc.get_value("message.timestamp.type") == "LogAppendTime" else CREATE_TIME,
        timestamp_before_max_ms=tc.message_timestamp_before_max_ms,
        timestamp_after_max_ms=tc.message_timestamp_after_max_ms,
        compacted=tc.compact,
    )


@dataclass
class Validated:
    buffer: memoryview                   # writable, one v2 batch
    record_count: int
    batch_count: int
    converted: bool


def max_uncompressed_bytes(max_message_bytes: int) -> int:
    """How far one compressed batch may inflate: INFLATION_MAX times max.message.bytes, at most
    UNCOMPRESSED_CEILING, never below max.message.bytes itself."""
    return max(max_message_bytes, min(max_message_bytes * INFLATION_MAX, UNCOMPRESSED_CEILING))


def needs_worker(records: bytes | bytearray | memoryview | None) -> bool:
    """True for a set too big to validate inline at all (smaller ones may still raise NeedsWorker)."""
    return records is not None and len(records) > INLINE_MAX_BYTES


def validate(records: bytes | bytearray | memoryview | None, rules: TopicRules, now_ms: int,
             api_version: int | None = None, *,
             inline: bool = False) -> Validated:
    """Check a partition's produced records and return them as one v2 batch; raise InvalidRecords.
    inline: keep to the inline budget (see the module docstring), else raise NeedsWorker, having
    changed nothing."""
    if records is None or len(records) == 0:
        raise InvalidRecords(ErrorCode.INVALID_RECORD, "the record set has no batch at all")
    view = memoryview(records).cast("B")
    try:
        magic = _frame(view, rules, api_version)
        cap = max_uncompressed_bytes(rules.max_message_bytes)
        if magic < 2:
            if inline and len(view) > LEGACY_INLINE_MAX_BYTES:
                raise NeedsWorker()
            return _validate_legacy(view, rules, now_ms, _Budget(cap, inline, LEGACY_INLINE_MAX_BYTES))
        if view.readonly:
            view = memoryview(bytearray(view))
        return _validate_v2(view, rules, now_ms, api_version, _Budget(cap, inline, INLINE_INFLATE_MAX))
    except InvalidRecordError as e:
        raise InvalidRecords(ErrorCode.INVALID_RECORD, str(e)) from None
    except codecs.DecompressionLimitError as e:
        raise InvalidRecords(ErrorCode.MESSAGE_TOO_LARGE, str(e)) from None
    except UnsupportedCodecError as e:
        raise InvalidRecords(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, str(e)) from None
    except ProtocolError as e:
        raise InvalidRecords(ErrorCode.CORRUPT_MESSAGE, str(e)) from None


def _frame(view: memoryview, rules: TopicRules, api_version: int | None) -> int:
    """Check the entries' framing, count, magics and sizes; return their magic."""
    end = len(view)
    if end > MAGIC_OFFSET and view[MAGIC_OFFSET] == 2 and end <= rules.max_message_bytes \
            and peek_offset_and_length(view, 0)[1] == end - LOG_OVERHEAD:
        return 2  # the common case: one v2 batch, exactly
    pos = 0
    magic = -1
    while pos < end:
        _, length = peek_offset_and_length(view, pos)
        if end - pos <= MAGIC_OFFSET or length < 0 or length > end - pos - LOG_OVERHEAD:
            raise ProtocolError("the record set ends in a truncated entry")
        entry_magic = view[pos + MAGIC_OFFSET]
        if entry_magic > 2:
            raise ProtocolError(f"record set entry with unknown magic {entry_magic}")
        if magic < 0:
            magic = entry_magic
            if api_version is not None and api_version >= 3 and magic != 2:
                raise InvalidRecordError(f"Produce requests of version {api_version} may only carry record "
                                         f"batches of magic 2")
        elif entry_magic != magic:
            raise InvalidRecordError(f"batch magic {entry_magic} differs from the first batch's magic {magic}")
        elif magic == 2 or (api_version is not None and api_version >= 3):
            raise InvalidRecordError("a partition's records must be exactly one record batch")
        if length + LOG_OVERHEAD > rules.max_message_bytes:
            raise InvalidRecords(ErrorCode.MESSAGE_TOO_LARGE,
                                 f"batch of {length + LOG_OVERHEAD} bytes exceeds max.message.bytes="
                                 f"{rules.max_message_bytes}")
        pos += LOG_OVERHEAD + length
    return magic


class _Budget:
    """How far records may inflate: `cap` always; `limit`, lower, when validating inline."""

    def __init__(self, cap: int, inline: bool, inline_max: int) -> None:
        self.cap = cap
        self.limit = min(cap, inline_max) if inline else cap
        self.loop = LoopBudget(INLINE_LOOP_MAX if inline else None)
        self.inline = inline

    def check_count(self, count: int, compressed: bool) -> None:
        """Refuse a compressed batch declaring more records than its inflated bytes can hold; send a
        batch past the inline budget to the workers."""
        need = count * (MIN_BODY_SIZE + 1)
        if compressed and need > self.cap:
            raise codecs.DecompressionLimitError(f"the batch declares {count} records, more than {self.cap} "
                                                 f"inflated bytes can hold")
        if self.inline and ((compressed and need > self.limit) or count > INLINE_MAX_RECORDS):
            raise NeedsWorker()

    def decompress(self, codec: int, data: bytes | memoryview) -> bytes | memoryview:
        try:
            return codecs.decompress(codec, data, max_bytes=self.limit)
        except codecs.DecompressionLimitError:
            if self.limit < self.cap:
                raise NeedsWorker() from None
            raise


def _validate_v2(view: memoryview, rules: TopicRules, now_ms: int, api_version: int | None,
                 budget: _Budget) -> Validated:
    h = BatchHeader(view, 0)
    if not h.is_valid():
        raise ProtocolError(f"the record batch fails its CRC (stored {h.crc:#010x}, computed "
                            f"{h.compute_crc():#010x})")
    _check_header(h, api_version)
    codec = h.compression
    body = view[HEADER_SIZE:h.size]
    budget.check_count(h.records_count, codec != codecs.NONE)
    if codec != codecs.NONE:
        data = budget.decompress(codec, body)
    else:
        data = body
    try:
        scan = scan_records(data, h.records_count, h.base_timestamp, _record_rules(rules, now_ms), budget.loop)
    except LoopBudgetExceeded:
        raise NeedsWorker() from None
    del data
    if scan.error_count:
        _refuse(scan.errors, scan.error_count, rules, now_ms)
    if rules.timestamp_type == LOG_APPEND_TIME:
        set_max_timestamp(view, 0, LOG_APPEND_TIME, now_ms)
    else:
        max_timestamp = h.base_timestamp + scan.max_timestamp_delta
        if not INT64_MIN <= max_timestamp <= INT64_MAX:
            raise InvalidRecords(ErrorCode.INVALID_TIMESTAMP, f"record timestamp {max_timestamp} does not fit "
                                                              f"in 64 bits")
        if max_timestamp != h.max_timestamp:
            set_max_timestamp(view, 0, CREATE_TIME, max_timestamp)
    return Validated(view, h.records_count, 1, False)


def _check_header(h: BatchHeader, api_version: int | None) -> None:
    if h.base_offset != 0:
        raise InvalidRecordError(f"the batch's base offset must be 0, not {h.base_offset}")
    if h.records_count <= 0 or h.last_offset_delta != h.records_count - 1:
        raise InvalidRecordError(f"the batch declares {h.records_count} records but last offset delta "
                                 f"{h.last_offset_delta}")
    if h.is_control:
        raise InvalidRecordError("clients may not produce control batches")
    if h.producer_id >= 0 and h.base_sequence < 0:
        raise InvalidRecordError(f"invalid sequence number {h.base_sequence} in a batch of producer "
                                 f"{h.producer_id}")
    if h.compression not in codecs.CODEC_NAMES:
        raise UnsupportedCodecError(f"unknown compression codec {h.compression}")
    if h.compression == codecs.ZSTD and api_version is not None and api_version < ZSTD_MIN_PRODUCE_VERSION:
        raise UnsupportedCodecError(f"Produce requests of version {api_version} may not use zstd")
    if h.timestamp_type == LOG_APPEND_TIME:
        text = _RECORD_ERROR_TEXT[LOG_APPEND_TIME_ERROR]
        raise InvalidRecords(ErrorCode.INVALID_TIMESTAMP, text,
                             [(i, text) for i in range(min(h.records_count, DEFAULT_MAX_ERRORS))])


def _validate_legacy(view: memoryview, rules: TopicRules, now_ms: int, budget: _Budget) -> Validated:
    try:
        conversion = legacy_to_v2_batch(view, _record_rules(rules, now_ms), max_uncompressed_bytes=budget.limit)
    except codecs.DecompressionLimitError:
        if budget.limit < budget.cap:
            raise NeedsWorker() from None
        raise
    if conversion.error_count:
        _refuse(conversion.errors, conversion.error_count, rules, now_ms)
    batch = conversion.batch
    assert batch is not None  # built whenever no record failed
    if len(batch) > rules.max_message_bytes:
        raise InvalidRecords(ErrorCode.MESSAGE_TOO_LARGE,
                             f"the converted batch of {len(batch)} bytes exceeds max.message.bytes="
                             f"{rules.max_message_bytes}")
    buffer = memoryview(bytearray(batch))
    if rules.timestamp_type == LOG_APPEND_TIME:
        set_max_timestamp(buffer, 0, LOG_APPEND_TIME, now_ms)
    return Validated(buffer, conversion.count, 1, True)


def _record_rules(rules: TopicRules, now_ms: int) -> RecordRules:
    if rules.timestamp_type == LOG_APPEND_TIME:
        return RecordRules(keys_required=rules.compacted, max_errors=rules.max_errors)
    return RecordRules(now_ms - rules.timestamp_before_max_ms, now_ms + rules.timestamp_after_max_ms,
                       rules.compacted, rules.max_errors)


def _refuse(errors: list[tuple[int, int]], error_count: int, rules: TopicRules, now_ms: int) -> None:
    """Raise the partition's error for per-record errors (Kafka's processRecordErrors)."""
    low = now_ms - rules.timestamp_before_max_ms
    high = now_ms + rules.timestamp_after_max_ms
    listed: list[tuple[int, str | None]] = []
    timestamps = False
    for index, kind in errors:
        if kind == TIMESTAMP_ERROR:
            text = f"Timestamp of record {index} is out of range: it must be within [{low}, {high}]"
        else:
            text = _RECORD_ERROR_TEXT[kind]
        timestamps = timestamps or kind in (TIMESTAMP_ERROR, LOG_APPEND_TIME_ERROR)
        listed.append((index, text))
    shown = "; ".join(f"record {i}: {t}" for i, t in listed[:3])
    if timestamps:
        raise InvalidRecords(ErrorCode.INVALID_TIMESTAMP,
                             f"{error_count} record(s) refused, at least one for its timestamp; the first: "
                             f"{shown}", listed)
    raise InvalidRecords(ErrorCode.INVALID_RECORD,
                         f"{error_count} record(s) refused; the first: {shown}", listed)
