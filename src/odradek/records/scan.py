"""Per-record checks of a v2 batch's records section, as Kafka's LogValidator makes them, without
building a Python object per record (DESIGN, "Performance principles": a header is never trusted on
its own; seed 004, "Record"; KIP-467 for per-record errors).

`scan_records(data, count, base_timestamp, rules)` walks `data`, the batch's records section after
decompression (record layout: `batch`), and proves:

- exactly `count` records fill `data`: every record's length varint is well formed, at least the
  6 bytes of the smallest record body (`MIN_BODY_SIZE`) and within the bytes left, and no byte is
  left over after the last record;
- inside each record: the timestamp delta (varlong) and the offset delta (varint) are well formed and
  the offset delta equals the record's index (0, 1, ..., count - 1); the key and value lengths are -1
  or fit in the record; the header count is >= 0 and each header's key length >= 0 and value length
  >= -1 fit in the record; the fields end exactly where the record's length says.

A violation raises `InvalidRecordError` naming the record (Kafka: InvalidRecordException, error
INVALID_RECORD for the whole partition). Conditions that Kafka reports record by record are collected
instead: a null key when `rules.keys_required` (compacted topics) and a timestamp (base_timestamp +
delta) outside [`timestamp_min`, `timestamp_max`] (CreateTime topics; -1, NO_TIMESTAMP, is never
range-checked). A record with both gets the key error, as in Kafka. At most `max_errors` are listed,
in index order; `error_count` counts all of them.

The scan also returns the largest timestamp delta: the caller stores base_timestamp + that as the
batch's max_timestamp, whatever the header claimed (ListOffsets by time relies on it).

Two implementations share this contract: `scan_records_loop`, a plain loop used below
`VECTOR_MIN_RECORDS` records (numpy's fixed cost per call is more than the loop's cost per record
there), and `scan_vector.scan_records_vector` for larger batches. Tests hold them to the same results.
Neither allocates more than a bounded chunk beyond `data`. A `LoopBudget` bounds the work done one
record or header at a time (the vectorised scan falls back to that for records of varied sizes and
for many headers), so the broker can scan on its event loop and hand the rest to a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from odradek.protocol.exceptions import ProtocolError
from odradek.records.varint import INT64_MAX, INT64_MIN, read_varint, read_varlong

MIN_BODY_SIZE = 6  # attributes, timestamp delta, offset delta, key length, value length, header count
MIN_HEADER_SIZE = 2  # key length and value length
VECTOR_MIN_RECORDS = 32
DEFAULT_MAX_ERRORS = 1000
NO_TIMESTAMP = -1

KEY_ERROR = 1        # a null key where keys are required
TIMESTAMP_ERROR = 2  # a timestamp outside the allowed range


class LoopBudgetExceeded(Exception):
    """The scan would do more plain-loop work than its budget allows (nothing was changed)."""


class LoopBudget:
    """How many units of plain-loop work (a record framed or checked one at a time, a header read one
    at a time) a scan may do; None: unlimited. Lets a caller on the event loop hand varied or
    header-heavy batches to a worker after a bounded amount of work."""

    __slots__ = ("left",)

    def __init__(self, units: int | None = None) -> None:
        self.left = units

    def spend(self, units: int) -> None:
        if self.left is not None:
            self.left -= units
            if self.left < 0:
                raise LoopBudgetExceeded()


class InvalidRecordError(ProtocolError):
    """The records of a batch do not match its header or their own lengths."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message if index is None else f"record {index}: {message}")
        self.index = index


@dataclass(slots=True)
class RecordRules:
    """What each record must satisfy besides its framing. Timestamps are absolute and inclusive;
    None leaves that side unchecked."""

    timestamp_min: int | None = None
    timestamp_max: int | None = None
    keys_required: bool = False
    max_errors: int = DEFAULT_MAX_ERRORS


@dataclass(slots=True)
class RecordsScan:
    count: int
    max_timestamp_delta: int
    errors: list[tuple[int, int]] = field(default_factory=list)  # (index, KEY_ERROR | TIMESTAMP_ERROR)
    error_count: int = 0


@dataclass(slots=True)
class DeltaBounds:
    """RecordRules' timestamps relative to one batch's base_timestamp, clamped to int64."""

    low: int
    high: int
    skip: int | None  # the delta that makes NO_TIMESTAMP; None when outside int64
    keys_required: bool
    max_errors: int

    @property
    def checks_timestamps(self) -> bool:
        return self.low > INT64_MIN or self.high < INT64_MAX


def delta_bounds(base_timestamp: int, rules: RecordRules) -> DeltaBounds:
    low = INT64_MIN if rules.timestamp_min is None else max(rules.timestamp_min - base_timestamp, INT64_MIN)
    high = INT64_MAX if rules.timestamp_max is None else min(rules.timestamp_max - base_timestamp, INT64_MAX)
    skip = NO_TIMESTAMP - base_timestamp
    return DeltaBounds(low, high, skip if INT64_MIN <= skip <= INT64_MAX else None, rules.keys_required,
                       max(rules.max_errors, 0))


def check_count(count: int, size: int) -> None:
    if count <= 0 or count > size // (MIN_BODY_SIZE + 1):
        raise InvalidRecordError(f"the batch declares {count} records, which {size} bytes of records "
                                 f"cannot hold")


def scan_records(data, count: int, base_timestamp: int, rules: RecordRules = RecordRules(),
                 budget: LoopBudget | None = None) -> RecordsScan:
    """Check every record of a records section (see the module docstring); LoopBudgetExceeded when
    it would take more plain-loop work than `budget`."""
    check_count(count, len(data))
    bounds = delta_bounds(base_timestamp, rules)
    if count < VECTOR_MIN_RECORDS:
        return scan_records_loop(data, count, bounds, budget)
    from odradek.records.scan_vector import scan_records_vector  # numpy: loaded by the broker only
    return scan_records_vector(data, count, bounds, budget)


def scan_records_loop(data, count: int, bounds: DeltaBounds, budget: LoopBudget | None = None) -> RecordsScan:
    """The plain loop: one record at a time, every length checked before it is used."""
    result = RecordsScan(count, INT64_MIN)
    end = len(data)
    pos = check_records(data, 0, end, 0, count, bounds, budget or LoopBudget(), result)
    if pos != end:
        raise InvalidRecordError(f"{end - pos} bytes are left over after the {count} records the batch "
                                 f"declares")
    return result


def check_records(data, pos: int, end: int, first: int, count: int, bounds: DeltaBounds, budget: LoopBudget,
                  result: RecordsScan) -> int:
    """Check records first..count-1 from pos, one at a time, into result; return where they end."""
    budget.spend(count - first)
    for i in range(first, count):
        if pos >= end:
            raise InvalidRecordError(f"the batch declares {count} records but holds {i}")
        quick = _quick_record(data, pos, end, i)
        if quick is not None:
            pos, timestamp_delta, key_length = quick
        else:
            try:
                pos, timestamp_delta, key_length = _check_record(data, pos, end, i, budget)
            except InvalidRecordError:
                raise
            except ProtocolError as e:
                raise InvalidRecordError(str(e), i) from None
        if timestamp_delta > result.max_timestamp_delta:
            result.max_timestamp_delta = timestamp_delta
        if bounds.keys_required and key_length < 0:
            note_error(result, bounds, i, KEY_ERROR)
        elif (timestamp_delta < bounds.low or timestamp_delta > bounds.high) and timestamp_delta != bounds.skip:
            note_error(result, bounds, i, TIMESTAMP_ERROR)
    return pos


def note_error(result: RecordsScan, bounds: DeltaBounds, index: int, kind: int) -> None:
    if result.error_count < bounds.max_errors:
        result.errors.append((index, kind))
    result.error_count += 1


def _quick_record(data, pos: int, end: int, i: int) -> tuple[int, int, int] | None:
    """`_check_record` for the common shape (length, offset delta and value length of at most two
    bytes, one-byte timestamp delta and key length, no headers), inline; None for any other record,
    good or bad, which `_check_record` then reads."""
    if end - pos < 8:
        return None
    b = data[pos]
    if b < 0x80:
        length = (b >> 1) ^ -(b & 1)
        p = pos + 1
    else:
        c = data[pos + 1]
        if c >= 0x80:
            return None
        u = (b & 0x7F) | (c << 7)
        length = (u >> 1) ^ -(u & 1)
        p = pos + 2
    record_end = p + length
    if length < MIN_BODY_SIZE or record_end > end:
        return None
    t = data[p + 1]
    o = data[p + 2]
    if t >= 0x80:
        return None
    if o < 0x80:
        if o != i + i:
            return None
        p += 3
    else:
        c = data[p + 3]
        if c >= 0x80 or (o & 0x7F) | (c << 7) != i + i:
            return None
        p += 4
    k = data[p]
    if k >= 0x80:
        return None
    key_length = (k >> 1) ^ -(k & 1)
    p += 1 + max(key_length, 0)
    if key_length < -1 or p + 2 > record_end:
        return None
    b = data[p]
    if b < 0x80:
        value_length = (b >> 1) ^ -(b & 1)
        p += 1
    else:
        c = data[p + 1]
        if c >= 0x80:
            return None
        u = (b & 0x7F) | (c << 7)
        value_length = (u >> 1) ^ -(u & 1)
        p += 2
    p += max(value_length, 0)
    if value_length < -1 or p + 1 != record_end or data[p] != 0:
        return None
    return record_end, (t >> 1) ^ -(t & 1), key_length


def _check_record(data, pos: int, end: int, i: int, budget: LoopBudget) -> tuple[int, int, int]:
    """Check record i at pos; return (end of the record, timestamp delta, key length)."""
    length, pos = read_varint(data, pos, end)
    if length < MIN_BODY_SIZE or length > end - pos:
        raise InvalidRecordError(f"length {length} is invalid for the {end - pos} bytes left", i)
    record_end = pos + length
    timestamp_delta, p = read_varlong(data, pos + 1, record_end)
    offset_delta, p = read_varint(data, p, record_end)
    if offset_delta != i:
        raise InvalidRecordError(f"offset delta {offset_delta}, expected {i}", i)
    key_length, p = read_varint(data, p, record_end)
    if key_length < -1 or key_length > record_end - p:
        _skip_bytes(data, p, record_end, i, "key", -1, key_length)  # raises, with the message
    p += max(key_length, 0)
    value_length, p = read_varint(data, p, record_end)
    if value_length < -1 or value_length > record_end - p:
        _skip_bytes(data, p, record_end, i, "value", -1, value_length)
    p += max(value_length, 0)
    headers, p = read_varint(data, p, record_end)
    if headers < 0 or headers > (record_end - p) // MIN_HEADER_SIZE:
        raise InvalidRecordError(f"header count {headers} is invalid for the bytes left", i)
    if headers:
        budget.spend(headers)
    for _ in range(headers):
        _, p = _skip_bytes(data, p, record_end, i, "header key", 0)
        _, p = _skip_bytes(data, p, record_end, i, "header value", -1)
    if p != record_end:
        raise InvalidRecordError(f"length {length} but its fields take {p - pos}", i)
    return record_end, timestamp_delta, key_length


def _skip_bytes(data, pos: int, end: int, i: int, what: str, smallest: int,
                n: int | None = None) -> tuple[int, int]:
    """A length varint (>= smallest) and the bytes it counts; n: the length, already read."""
    if n is None:
        n, pos = read_varint(data, pos, end)
    if n < smallest:
        raise InvalidRecordError(f"{what} length {n} is negative", i)
    if n > end - pos:
        raise InvalidRecordError(f"{what} length {n} runs past the end of the record", i)
    return n, pos + max(n, 0)
