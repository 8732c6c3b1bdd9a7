"""Consumer state that needs no I/O: partition positions, fetched data, and what a batch hands out.

Seed 003, "The Consumer" and "Consumer Position": the consumer's state per partition is one number,
the offset of the next record to hand out (`position`). Next to it the fetcher keeps the offset of the
next record to *fetch* (`fetch_offset`), which runs ahead of it by the responses fetched but not yet
read: a partition is fetched again while fewer than MAX_BUFFERED_FETCHES (2) of its responses are
buffered, so the next Fetch is in flight while the application reads the previous response
(pipelining, bounded: two buffered responses per partition, one Fetch in flight per broker).

`epoch` changes on every seek, reset, assign and pause: a response or buffered data from an older epoch
is dropped, so nothing fetched before a seek is ever handed out after it.

`CompletedFetch` walks one partition's records from a Fetch response, batch by batch, skipping control
batches and, with read_committed, batches of aborted transactions (the aborted_transactions list of the
response, as Kafka's consumer does: a producer id is aborted from its first offset until its ABORT
marker). The per-record path decodes its batches in bulk (`odradek.records.columns`), each record once,
and keeps its place across polls; `ConsumerRecord`s are named tuples made from the decoded columns by
C calls, without a Python frame per record (and, for large polls, without the cyclic GC walking them
while they are made: `records_from_columns`).
"""

from __future__ import annotations

import gc
import heapq
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.batch import RecordBatch
from odradek.records.columns import RecordColumns, decode_batches
from odradek.records.control import ABORT, parse_control_key
from odradek.records.convert import legacy_to_v2
from odradek.records.record_set import iter_batches


# Responses per partition fetched but not yet read: with 2 the next Fetch is in flight while the
# application reads the previous response, and memory stays bounded by two responses a partition.
MAX_BUFFERED_FETCHES = 2
# Whole batches are decoded at once until a chunk holds this many records (amortising numpy's cost per
# call) or this many batch bytes (bounding the memory and the event loop's time per decode).
DECODE_CHUNK_RECORDS = 16384
DECODE_CHUNK_BYTES = 4 << 20
# From this many records on, the cyclic GC is paused while their ConsumerRecords are made (see
# records_from_columns).
GC_PAUSE_MIN_RECORDS = 2048


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int = -1


class ConsumerRecord(NamedTuple):
    """One record as the consumer hands it out: an immutable named tuple, built in bulk."""
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int          # 0 CreateTime, 1 LogAppendTime, -1 none (magic 0)
    key: bytes | None
    value: bytes | None
    headers: tuple               # ((str, bytes | None), ...)

    def __repr__(self) -> str:
        return (f"ConsumerRecord({self.topic}-{self.partition}@{self.offset}, ts={self.timestamp}, "
                f"key={self.key!r}, value={self.value!r}, headers={self.headers!r})")


_new_tuple = tuple.__new__


def records_from_columns(tp: TopicPartition, cols: RecordColumns, start: int = 0,
                         stop: int | None = None) -> list[ConsumerRecord]:
    """ConsumerRecords for records start..stop-1 of decoded columns, each made by one C call (no
    Python frame per record).

    From GC_PAUSE_MIN_RECORDS records on, the cyclic GC is paused while they are made (no Python code
    runs meanwhile, so no other thread sees it paused). Otherwise a young collection runs every 700 new
    records, an older one every 10 of those and a full one often, each walking the records still
    alive: at polls of 100000 records of 100 B the GC took more time than everything else. Paused,
    the new records of a chunk meet one young collection, and the older collections run 10 times
    less often."""
    c = cols.slice(start, len(cols) if stop is None else stop)
    n = len(c)
    fields = zip(repeat(tp.topic, n), repeat(tp.partition, n), c.offsets, c.timestamps, c.timestamp_types, c.keys,
                 c.values, c.headers if c.headers is not None else repeat((), n))
    if n < GC_PAUSE_MIN_RECORDS or not gc.isenabled():
        return list(map(_new_tuple, repeat(ConsumerRecord, n), fields))
    gc.disable()
    try:
        return list(map(_new_tuple, repeat(ConsumerRecord, n), fields))
    finally:
        gc.enable()


@dataclass(slots=True)
class FetchedBatch:
    """One whole v2 record batch as the broker sent it (the batch-level read path).

    `data` is the batch's raw bytes (a memoryview into the response; copy with bytes() to keep it
    past the next read). Records before `first_offset` were already handed out (a fetch returns the
    whole batch that holds the fetch offset); a bulk reader skips them. Legacy (magic 0/1) entries are
    up-converted to v2 first.
    """
    topic: str
    partition: int
    data: memoryview
    base_offset: int
    last_offset: int
    first_offset: int
    records_count: int
    compression: int
    high_watermark: int

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    def records(self, *, check_crc: bool = True) -> list[ConsumerRecord]:
        batch = RecordBatch(self.data)
        if check_crc:
            batch.ensure_valid()
        return records_from_columns(TopicPartition(self.topic, self.partition),
                                    decode_batches([batch], self.first_offset))


class PartitionState:
    __slots__ = ("tp", "position", "fetch_offset", "reset", "paused", "epoch", "in_flight", "buffered",
                 "high_watermark", "last_stable_offset", "log_start_offset", "retry_at_ms")

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.position: int | None = None       # next offset to hand out; None until known
        self.fetch_offset: int | None = None   # next offset to fetch
        self.reset: str | int | None = None    # pending reset: "earliest", "latest" or a timestamp
        self.paused = False
        self.epoch = 0
        self.in_flight = False
        self.buffered = 0                      # completed fetches not yet read
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1
        self.retry_at_ms = 0.0

    def seek(self, offset: int) -> None:
        self.position = self.fetch_offset = offset
        self.reset = None
        self.epoch += 1
        self.buffered = 0

    def request_reset(self, strategy) -> None:
        self.position = self.fetch_offset = None
        self.reset = strategy
        self.epoch += 1
        self.buffered = 0

    def fetchable(self, now_ms: float) -> bool:
        return (self.fetch_offset is not None and not self.paused and not self.in_flight
                and self.buffered < MAX_BUFFERED_FETCHES and now_ms >= self.retry_at_ms)


class CompletedFetch:
    """A partition's records from one Fetch response, handed out as records or as whole batches.

    The entries (batch views) are listed once when the response arrives (`end_offset`: where the next
    fetch starts). The record path decodes the readable batches a chunk at a time (whole batches, up to
    DECODE_CHUNK_RECORDS records or DECODE_CHUNK_BYTES bytes), each record exactly once, and keeps its
    place in the chunk across polls of any size (`take_records`). The batch path (`take_batch`) hands out the rest of
    a partly read chunk batch by batch, then the following batches."""

    def __init__(self, state: PartitionState, records, fetch_offset: int, high_watermark: int,
                 aborted: list | None, read_committed: bool, check_crcs: bool) -> None:
        self.state = state
        self.tp = state.tp
        self.epoch = state.epoch
        self.records = records
        self.fetch_offset = fetch_offset
        self.high_watermark = high_watermark
        self.read_committed = read_committed
        self.check_crcs = check_crcs
        self._aborted = [(a.first_offset, a.producer_id) for a in (aborted or ())] if read_committed else []
        heapq.heapify(self._aborted)
        self._aborted_pids: set[int] = set()
        self._entries = list(iter_batches(records, allow_partial_tail=True))
        self._index = 0
        self.end_offset = max([fetch_offset] + [e.next_offset for e in self._entries[-1:]])
        self.next_offset = fetch_offset   # after the last entry taken from _entries
        self._chunk: list = []            # entries decoded into _decoded
        self._chunk_index = 0             # the batch path's place in _chunk
        self._decoded: RecordColumns | None = None
        self._cursor = 0                  # next record of _decoded to hand out

    def scan_end(self) -> int:
        """The offset after the last whole batch (where the next fetch starts); fetch_offset if none."""
        return self.end_offset

    def next_batch(self):
        """The next readable entry (RecordBatch or LegacyBatch), or None when done: control batches,
        aborted batches and batches wholly before the fetch offset are skipped. A batch failing its CRC
        (check.crcs) raises ProtocolError here, every time, as Kafka's consumer does: the place is not
        moved past it, so the application decides (seek past it, or stop)."""
        entries = self._entries
        while self._index < len(entries):
            entry = entries[self._index]
            if entry.next_offset <= self.next_offset:
                self._index += 1
                continue
            if self.check_crcs:
                entry.ensure_valid()
            self._index += 1
            self.next_offset = entry.next_offset
            pid = getattr(entry, "producer_id", -1)
            if self.read_committed and pid >= 0:
                while self._aborted and self._aborted[0][0] <= entry.last_offset:
                    self._aborted_pids.add(heapq.heappop(self._aborted)[1])
                if entry.is_control:
                    if self._is_abort_marker(entry):
                        self._aborted_pids.discard(pid)
                    continue
                if entry.is_transactional and pid in self._aborted_pids:
                    continue
            if entry.is_control:
                continue
            return entry
        return None

    def take_records(self, position: int, limit: int) -> list[ConsumerRecord]:
        """Up to `limit` (>= 1) records from `position` on, in order; [] once this fetch has no more.
        The caller moves the position to the last record's offset + 1.

        Record objects are made per call, for the records handed out: with small polls they die
        before the cyclic GC's next young collection, which would otherwise visit each of them."""
        cols, i, j = self._take(position, limit)
        return records_from_columns(self.tp, cols, i, j) if cols is not None else []

    def take_columns(self, position: int, limit: int) -> RecordColumns | None:
        """`take_records` as columns (no record objects); None once this fetch has no more."""
        cols, i, j = self._take(position, limit)
        return cols.slice(i, j) if cols is not None else None

    def _take(self, position: int, limit: int) -> tuple[RecordColumns | None, int, int]:
        cols = self._decoded
        i = self._cursor
        if cols is None or i >= len(cols):
            cols = self._decode_chunk(position)
            i = 0
            if cols is None:
                return None, 0, 0
        j = min(i + limit, len(cols))
        self._cursor = j
        if j == len(cols):   # all handed out: the caller may keep (and extend) the columns
            self._decoded = None
            self._chunk, self._chunk_index = [], 0
        return cols, i, j

    def _decode_chunk(self, position: int) -> RecordColumns | None:
        """Decode the next readable batches at once: what the batch path left of the current chunk, then
        more whole batches while the chunk is under DECODE_CHUNK_RECORDS records and DECODE_CHUNK_BYTES
        bytes; None when no record is left."""
        left = [e for e in self._chunk[self._chunk_index:] if e.next_offset > position]
        out: RecordColumns | None = None
        chunk: list = []
        while out is None or not len(out):
            entries = left
            left = []
            n = sum(e.records_count if isinstance(e, RecordBatch) else 1 for e in entries)
            size = sum(e.size for e in entries)
            while n < DECODE_CHUNK_RECORDS and size < DECODE_CHUNK_BYTES:
                try:
                    entry = self.next_batch()
                except ProtocolError:
                    if entries:   # hand out the records before a corrupt batch first; it raises next
                        break
                    raise
                if entry is None:
                    break
                entries.append(entry)
                n += entry.records_count if isinstance(entry, RecordBatch) else 1
                size += entry.size
            if not entries:
                break
            chunk += entries
            try:
                out = _joined(out, _decode(self.tp, entries, position))
            except ProtocolError:   # keep the batches: the next call decodes (and refuses) them again
                self._chunk, self._chunk_index, self._decoded, self._cursor = chunk, 0, None, 0
                raise
        self._chunk = chunk
        self._chunk_index = 0
        self._decoded = out if out is not None and len(out) else None
        self._cursor = 0
        return self._decoded

    def take_batch(self, position: int):
        """The next entry holding records at or after `position`, for the batch path: first what is
        left of the current chunk (partly handed out as records), then the following entries; None when
        done."""
        self._decoded, self._cursor = None, 0
        chunk = self._chunk
        while self._chunk_index < len(chunk):
            entry = chunk[self._chunk_index]
            self._chunk_index += 1
            if entry.next_offset > position:
                return entry
        return self.next_batch()

    @staticmethod
    def _is_abort_marker(entry) -> bool:
        try:
            for r in entry.records(check_crc=False):
                return parse_control_key(r.key)[1] == ABORT
        except ProtocolError:
            return False
        return False


def _decode(tp: TopicPartition, entries: list, position: int) -> RecordColumns:
    """The records of `entries` from `position` on: runs of v2 batches in bulk, legacy entries one by
    one, in order."""
    out: RecordColumns | None = None
    v2: list = []
    for entry in entries:
        if isinstance(entry, RecordBatch):
            v2.append(entry)
            continue
        if v2:
            out = _joined(out, decode_batches(v2, position))
            v2 = []
        legacy = entry.records(check_crc=False, max_uncompressed_bytes=codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES)
        out = _joined(out, RecordColumns.of_records([r for r in legacy if r.offset >= position]))
    if v2 or out is None:
        out = _joined(out, decode_batches(v2, position))
    return out


def _joined(first: RecordColumns | None, second: RecordColumns) -> RecordColumns:
    if first is None:
        return second
    first.extend(second)
    return first


def to_fetched_batch(tp: TopicPartition, entry, first_offset: int, high_watermark: int) -> FetchedBatch:
    if isinstance(entry, RecordBatch):
        data = memoryview(entry.buf)[entry.pos:entry.pos + entry.size]
        return FetchedBatch(tp.topic, tp.partition, data, entry.base_offset, entry.last_offset,
                            max(first_offset, entry.base_offset), entry.records_count, entry.compression,
                            high_watermark)
    raw = bytes(memoryview(entry.buf)[entry.pos:entry.pos + entry.size])
    converted = legacy_to_v2(raw)
    batch = RecordBatch(converted)
    return FetchedBatch(tp.topic, tp.partition, memoryview(converted)[:batch.size], batch.base_offset,
                        batch.last_offset, max(first_offset, batch.base_offset), batch.records_count,
                        batch.compression, high_watermark)


def records_of(tp: TopicPartition, entry, first_offset: int, check_crcs: bool) -> list[ConsumerRecord]:
    """The records of one batch (v2 or legacy) at or after first_offset, one by one: the reference
    for the bulk path, and the path for legacy entries."""
    if check_crcs:
        entry.ensure_valid()
    ts_type = entry.timestamp_type
    topic, partition = tp
    return [ConsumerRecord(topic, partition, r.offset, r.timestamp, ts_type, r.key, r.value, tuple(r.headers))
            for r in entry.records(check_crc=False, max_uncompressed_bytes=codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES)
            if r.offset >= first_offset]
