"""Validation of a produced record set before it reaches the log (seed 003, "The Producer"; Kafka's
LogValidator).

The hot path does no per-record work: each v2 batch's header is read in place, its CRC checked over
the bytes (C speed), its size checked against `max.message.bytes`, its timestamps against
`message.timestamp.type` and the allowed difference. Per-record work happens only where the design
needs it: compacted topics need every record to have a key; legacy message sets (magic 0 and 1, from
old clients) are converted to v2, as Kafka 3+ stores only v2.

The result is a writable buffer of v2 batches; the log assigns offsets by patching their headers.
"""

from __future__ import annotations

from dataclasses import dataclass

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.records.batch import RecordBatch
from odradek.records.convert import legacy_to_v2
from odradek.records.header import (
    MAGIC_OFFSET, LOG_OVERHEAD, iter_headers, peek_offset_and_length, set_max_timestamp,
)

CREATE_TIME = 0
LOG_APPEND_TIME = 1


class InvalidRecords(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


@dataclass
class TopicRules:
    max_message_bytes: int
    timestamp_type: int                  # CREATE_TIME or LOG_APPEND_TIME
    timestamp_before_max_ms: int
    timestamp_after_max_ms: int
    compacted: bool


@dataclass
class Validated:
    buffer: memoryview                   # writable, v2 batches only
    record_count: int
    batch_count: int
    converted: bool


def validate(records, rules: TopicRules, now_ms: int) -> Validated:
    if records is None or len(records) == 0:
        raise InvalidRecords(ErrorCode.INVALID_RECORD, "empty record set")
    view = memoryview(records)
    if len(view) < LOG_OVERHEAD + 5:
        raise InvalidRecords(ErrorCode.CORRUPT_MESSAGE, "record set shorter than one entry header")
    magic = view[MAGIC_OFFSET]
    converted = False
    try:
        if magic < 2:
            _check_legacy_sizes(view, rules)
            view = memoryview(bytearray(legacy_to_v2(view, base_offset=0)))
            converted = True
        elif magic != 2:
            raise InvalidRecords(ErrorCode.CORRUPT_MESSAGE, f"unknown magic {magic}")
        elif view.readonly:
            view = memoryview(bytearray(view))
        headers = list(iter_headers(view))
    except ProtocolError as e:
        raise InvalidRecords(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    count = 0
    for h in headers:
        if h.size > rules.max_message_bytes:
            raise InvalidRecords(ErrorCode.MESSAGE_TOO_LARGE,
                                 f"batch of {h.size} bytes exceeds max.message.bytes={rules.max_message_bytes}")
        if not converted and not h.is_valid():
            raise InvalidRecords(ErrorCode.CORRUPT_MESSAGE, f"batch at offset {h.base_offset} fails its CRC")
        if h.is_control:
            raise InvalidRecords(ErrorCode.INVALID_RECORD, "clients may not produce control batches")
        if h.records_count <= 0 or h.last_offset_delta != h.records_count - 1:
            raise InvalidRecords(ErrorCode.INVALID_RECORD,
                                 f"batch declares {h.records_count} records but last offset delta "
                                 f"{h.last_offset_delta}")
        count += h.records_count
        if rules.timestamp_type == CREATE_TIME:
            for ts in (h.base_timestamp, h.max_timestamp):
                if ts < 0:
                    continue
                if ts < now_ms - rules.timestamp_before_max_ms or ts > now_ms + rules.timestamp_after_max_ms:
                    raise InvalidRecords(ErrorCode.INVALID_TIMESTAMP,
                                         f"timestamp {ts} is out of the allowed range around {now_ms}")
        else:
            set_max_timestamp(view, h.pos, LOG_APPEND_TIME, now_ms)
        if rules.compacted:
            try:
                for r in RecordBatch(view, h.pos).records(check_crc=False):
                    if r.key is None:
                        raise InvalidRecords(ErrorCode.INVALID_RECORD,
                                             "compacted topics require every record to have a key")
            except ProtocolError as e:
                raise InvalidRecords(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    return Validated(view, count, len(headers), converted)


def _check_legacy_sizes(view: memoryview, rules: TopicRules) -> None:
    pos = 0
    while pos + LOG_OVERHEAD <= len(view):
        _, size = peek_offset_and_length(view, pos)
        if size + LOG_OVERHEAD > rules.max_message_bytes:
            raise InvalidRecords(ErrorCode.MESSAGE_TOO_LARGE,
                                 f"message of {size} bytes exceeds max.message.bytes={rules.max_message_bytes}")
        pos += LOG_OVERHEAD + max(size, 0)
