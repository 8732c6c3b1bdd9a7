"""Consumer state that needs no I/O: partition positions, fetched data, and what a batch hands out.

Seed 003, "The Consumer" and "Consumer Position": the consumer's state per partition is one number,
the offset of the next record to hand out (`position`). Next to it the fetcher keeps the offset of the
next record to *fetch* (`fetch_offset`), which runs ahead by at most one fetched-but-unread response,
so one Fetch per broker can be in flight while the application reads the previous one (pipelining,
bounded: one buffered response plus one in flight per partition).

`epoch` changes on every seek, reset, assign and pause: a response or buffered data from an older epoch
is dropped, so nothing fetched before a seek is ever handed out after it.

`CompletedFetch` walks one partition's records from a Fetch response, batch by batch, skipping control
batches and, with read_committed, batches of aborted transactions (the aborted_transactions list of the
response, as Kafka's consumer does: a producer id is aborted from its first offset until its ABORT
marker).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.batch import RecordBatch
from odradek.records.control import ABORT, parse_control_key
from odradek.records.convert import legacy_to_v2
from odradek.records.record_set import iter_batches


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int = -1


class ConsumerRecord:
    __slots__ = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers")

    def __init__(self, topic, partition, offset, timestamp, timestamp_type, key, value, headers) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.timestamp_type = timestamp_type     # 0 CreateTime, 1 LogAppendTime
        self.key = key
        self.value = value
        self.headers = headers                   # [(str, bytes | None)]

    def __repr__(self) -> str:
        return (f"ConsumerRecord({self.topic}-{self.partition}@{self.offset}, ts={self.timestamp}, "
                f"key={self.key!r}, value={self.value!r}, headers={self.headers!r})")


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
        ts_type = batch.timestamp_type
        return [ConsumerRecord(self.topic, self.partition, r.offset, r.timestamp, ts_type, r.key, r.value,
                               r.headers)
                for r in batch.records(check_crc=check_crc) if r.offset >= self.first_offset]


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
                and self.buffered == 0 and now_ms >= self.retry_at_ms)


class CompletedFetch:
    """A partition's records from one Fetch response, read batch by batch."""

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
        self._iter = iter_batches(records, allow_partial_tail=True)
        self.next_offset = fetch_offset
        self.pending = None    # a batch handed out in part (max.poll.records); the rest goes next
        self.done = False

    def scan_end(self) -> int:
        """The offset after the last whole batch (where the next fetch starts); fetch_offset if none."""
        end = self.fetch_offset
        for entry in iter_batches(self.records, allow_partial_tail=True):
            end = max(end, entry.next_offset)
        return end

    def next_batch(self):
        """The next batch to hand out (RecordBatch or LegacyBatch), or None when done.

        Control batches, aborted batches and batches wholly before the fetch offset are skipped.
        """
        for entry in self._iter:
            if entry.next_offset <= self.next_offset:
                continue
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
            if self.check_crcs:
                entry.ensure_valid()
            return entry
        self.done = True
        return None

    @staticmethod
    def _is_abort_marker(entry) -> bool:
        try:
            for r in entry.records(check_crc=False):
                return parse_control_key(r.key)[1] == ABORT
        except ProtocolError:
            return False
        return False


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
    """The records of one batch at or after first_offset."""
    ts_type = entry.timestamp_type
    out = []
    topic, partition = tp
    for r in entry.records(check_crc=False, max_uncompressed_bytes=codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES):
        if r.offset >= first_offset:
            out.append(ConsumerRecord(topic, partition, r.offset, r.timestamp, ts_type, r.key, r.value,
                                      r.headers))
    return out
