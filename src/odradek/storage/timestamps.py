"""Finding a record by timestamp (ListOffsets by timestamp and MAX_TIMESTAMP), a bounded search.

The indexes narrow a search to a few batches (the plan is made by `LogSegment.timestamp_scan`); the
answer is a record's offset, so those batches' records are read. After the 61-byte header (see
`odradek.records.header`) each record is:

    length varint, attributes int8, timestamp_delta varlong, offset_delta varint, key..., value...,
    headers...        (varints zigzag-encoded; a record's timestamp = base_timestamp + delta)

Only the first three fields are decoded. With LogAppendTime every record's timestamp is the batch's
max_timestamp. A compressed batch is decompressed with `decompress(codec, data) -> bytes`
(`odradek.records.codecs.decompress` by default in Log, size-capped); without one, or if the data does
not decompress, the answer is the batch's first offset at or after `min_offset`, which is never later
than the exact answer, so a consumer starting there misses nothing.

A `TimestampScan` reads one segment file through a descriptor of its own (a duplicate, closed when
the scan ends) and touches nothing else, so it may run on any thread: the broker runs it on its worker
pool. It walks the batches from `start`, skipping unread every batch whose header max_timestamp is
below the target. With honest headers the answer lies at or before the batch holding `until_offset`
(the time index says so, see segment.py), a range of about `index.interval.bytes`. A header can lie
(a batch claiming a max_timestamp that none of its records has, as an old producer or a corrupt
client may write): past that batch the scan goes on for at most `budget_bytes` (bytes of batches
walked plus bytes decompressed) and then answers with the first record where it stopped, never later
than the exact answer.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable

from odradek.protocol.exceptions import ProtocolError
from odradek.records.header import HEADER_SIZE, BatchHeader
from odradek.storage.errors import CorruptRecordError
from odradek.storage.scan import scan_batches

Decompress = Callable[[int, bytes], bytes]

LOG_APPEND_TIME = 1
SCAN_BUDGET_BYTES = 4 * 1024 * 1024  # per lookup, past the range an honest index points at
_EARLIEST = -(2**63)


def offset_for_timestamp(batch: bytes, target_timestamp: int, min_offset: int,
                         decompress: Decompress | None = None) -> tuple[int, int] | None:
    """(timestamp, offset) of the first record >= min_offset whose timestamp >= target, or None.

    The timestamp reported for LogAppendTime batches, and for compressed batches searched without
    `decompress`, is the batch's max_timestamp."""
    return search_batch(batch, target_timestamp, min_offset, decompress)[0]


def search_batch(batch: bytes, target_timestamp: int, min_offset: int,
                 decompress: Decompress | None = None) -> tuple[tuple[int, int] | None, int]:
    """`offset_for_timestamp`, and how many bytes decompression produced (the work it took)."""
    try:
        h = BatchHeader(batch, 0)
    except ProtocolError as e:
        raise CorruptRecordError(str(e)) from e
    if h.max_timestamp < target_timestamp or h.last_offset < min_offset:
        return None, 0
    if h.timestamp_type == LOG_APPEND_TIME:
        return (h.max_timestamp, max(h.base_offset, min_offset)), 0
    records: bytes | memoryview = memoryview(batch)[HEADER_SIZE:h.size]
    if h.compression:
        try:
            if decompress is None:
                raise ProtocolError("no decompressor")
            records = decompress(h.compression, records)
        except ProtocolError:
            return (h.max_timestamp, max(h.base_offset, min_offset)), 0
    end = len(records)
    pos = 0
    for _ in range(h.records_count):
        length, pos = _varint(records, pos)
        start = pos
        if length < 3 or start + length > end:
            # Three bytes is the shortest record; a negative length would walk backwards forever.
            raise CorruptRecordError(f"record length {length} at byte {start} of the batch at offset "
                                     f"{h.base_offset}")
        pos += 1  # attributes
        ts_delta, pos = _varint(records, pos)
        offset_delta, pos = _varint(records, pos)
        offset = h.base_offset + offset_delta
        timestamp = h.base_timestamp + ts_delta
        if timestamp >= target_timestamp and offset >= min_offset:
            return (timestamp, offset), end if h.compression else 0
        pos = start + length
    return None, end if h.compression else 0


class TimestampScan:
    """One planned search of a segment file; `run()` once, on any thread (see the module docstring).

    `until_offset`: the batch holding it ends the range an honest index points at (None: the whole of
    [start, end) is that range). `conservative`: past the budget answer with the first record there
    (a timestamp search); otherwise answer None (MAX_TIMESTAMP: Kafka answers no offset when the batch
    holding the maximum has no record with it)."""

    __slots__ = ("file", "start", "end", "until_offset", "target", "min_offset", "decompress",
                 "budget_bytes", "conservative", "work_bytes")

    def __init__(self, file: io.FileIO, start: int, end: int, until_offset: int | None, target: int,
                 min_offset: int, decompress: Decompress | None, budget_bytes: int,
                 conservative: bool = True) -> None:
        self.file = file
        self.start = start
        self.end = end
        self.until_offset = until_offset
        self.target = target
        self.min_offset = min_offset
        self.decompress = decompress
        self.budget_bytes = budget_bytes
        self.conservative = conservative
        self.work_bytes = 0  # spent past the honest range, known once run() returns

    def run(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record >= min_offset with timestamp >= target, or None."""
        try:
            return self._search()
        finally:
            self.file.close()

    def _search(self) -> tuple[int, int] | None:
        fd = self.file.fileno()
        until = self.until_offset
        for b in scan_batches(fd, self.start, self.end):
            if b.last_offset < self.min_offset:
                continue
            past = until is not None and b.base_offset > until
            if past:
                if self.work_bytes >= self.budget_bytes:
                    return self._first_record(fd, b) if self.conservative else None
                self.work_bytes += b.size
            if b.max_timestamp < self.target:
                continue
            found, inflated = search_batch(_pread(fd, b.position, b.size), self.target,
                                           self.min_offset, self.decompress)
            if past:
                self.work_bytes += inflated
            if found is not None:
                return found
        return None

    def _first_record(self, fd: int, b) -> tuple[int, int]:
        found, _ = search_batch(_pread(fd, b.position, b.size), _EARLIEST, self.min_offset,
                                self.decompress)
        return found if found is not None else (b.max_timestamp, max(b.base_offset, self.min_offset))


def _pread(fd: int, position: int, length: int) -> bytes:
    data = os.pread(fd, length, position)
    if len(data) != length:
        raise CorruptRecordError(f"{length - len(data)} bytes of a batch missing at {position}", position)
    return data


def _varint(buf, pos: int) -> tuple[int, int]:
    """A zigzag varint (up to 10 bytes) at pos: (value, next position)."""
    raw = 0
    for shift in range(0, 70, 7):
        if pos >= len(buf):
            raise CorruptRecordError("record truncated inside a varint")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
    raise CorruptRecordError("varint longer than 10 bytes")
