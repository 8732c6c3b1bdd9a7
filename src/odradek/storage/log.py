"""Log: the on-disk log of one partition, a directory of segments.

Directory `<log.dir>/<topic>-<partition>/`:

    00000000000000000000.log / .index / .timeindex    segments, see segment.py
    00000000000001048576.log / ...                    named by base offset
    leader-epoch-checkpoint                           see epoch_cache.py
    00000000000001048576.snapshot                     producer state, see producer_state.py
    00000000000001048576.txnindex                     aborted transactions, see txn_index.py
    *.deleted                                         segments waiting for file.delete.delay.ms
    *.cleaned, *.swap                                 a cleaned segment being swapped in, see
                                                      cleaner_swap.py (resolved on open)

Invariants (asserted where they hold):
- there is always at least one segment; the last one is the active segment, the only one appended to;
- segments are sorted by base offset and a segment's base offset is at least the previous one's next
  offset; offsets only grow;
- first segment base offset <= log_start_offset <= high_watermark <= log_end_offset;
- recovery_point <= log_end_offset: every segment wholly below it has been fsynced;
- a read returns whole batches only, from [log_start_offset, min(max_offset, log_end_offset)).

The leader assigns offsets by patching each batch's base_offset and partition_leader_epoch in place
(neither is covered by the CRC) and appends the buffer with one write; records are never rebuilt.
Nothing here fsyncs unless `flush.messages` / `flush.ms` say so, or a rolled segment is flushed by the
periodic task, as Kafka does. Not thread-safe: one caller at a time. The cleaner's threads never call
a Log: they read pinned segment files and hand cleaned segments back to the caller's thread, which
swaps them in with `replace_segments` (cleaner.py).
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.crc import crc32c
from odradek.records.header import BatchHeader, iter_headers, set_base_offset, \
    set_partition_leader_epoch
from odradek.storage.checkpoints import fsync_dir, sync_file
from odradek.storage.cleaner_swap import commit_swap, recover_swaps
from odradek.storage.config import LogConfig
from odradek.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache
from odradek.storage.errors import CorruptRecordError, OffsetOutOfRangeError, \
    RecordListTooLargeError, StorageError, UnexpectedAppendOffsetError
from odradek.storage.fileslice import FileSlice
from odradek.storage.index import NO_TIMESTAMP
from odradek.storage.names import parse_log_dir_name
from odradek.storage.page_cache import step_bytes
from odradek.storage.producer_state import CompletedTxn, PreparedAppend, ProducerStateManager, \
    load_producer_state
from odradek.storage.recovery import recover_segment
from odradek.storage.scan import scan_batches
from odradek.storage.segment import DELETED_SUFFIX, LogSegment
from odradek.storage.timestamps import SCAN_BUDGET_BYTES, Decompress, TimestampScan
from odradek.storage.txn_index import AbortedTxn

logger = logging.getLogger("odradek.storage")

MAX_LOADED_INACTIVE_SEGMENTS = 8  # inactive segments whose indexes stay in memory, per log
_SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
_ATTRIBUTES = struct.Struct(">h")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_TIMESTAMP_TYPE_LOG_APPEND_TIME = 0x08


@dataclass(frozen=True)
class FlushJob:
    """A flush of a log's segments up to `up_to`, to run on any thread (`Log.flush_job`). Files are
    named by path: one renamed or deleted meanwhile (retention, a cleaned segment swapped in, which the
    cleaner synced itself) is skipped."""
    up_to: int
    truncations: int
    paths: tuple[Path, ...]
    directory: Path
    parent: Path | None = None          # the log dir, for a partition directory created since the last flush

    def run(self) -> None:
        for path in self.paths:
            sync_file(path)
        try:
            fsync_dir(self.directory)
            if self.parent is not None:
                fsync_dir(self.parent)
        except FileNotFoundError:       # the partition was deleted meanwhile
            pass


@dataclass(frozen=True, slots=True)
class LogAppendInfo:
    first_offset: int
    last_offset: int
    max_timestamp: int  # -1 if no batch had a timestamp
    offset_of_max_timestamp: int
    log_append_time_ms: int  # -1 unless the batches were stamped with LogAppendTime
    log_start_offset: int
    batch_count: int
    size_bytes: int
    duplicate: bool = False  # an idempotent producer's retry: nothing was appended


@dataclass(frozen=True, slots=True)
class TimestampAndOffset:
    timestamp: int
    offset: int
    leader_epoch: int | None


class Log:
    def __init__(self, directory: Path, config: LogConfig, segments: list[LogSegment],
                 decompress: Decompress | None) -> None:
        self.dir = directory
        self.topic, self.partition = parse_log_dir_name(directory.name)
        self.config = config
        self.decompress = decompress or codecs.decompress
        self._segments = segments
        self._base_offsets = [s.base_offset for s in segments]
        self._log_start_offset = 0
        self._log_end_offset = 0
        self._recovery_point = 0
        self._high_watermark = 0
        self._last_flush_ms = 0
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self._loaded_inactive: OrderedDict[int, LogSegment] = OrderedDict()
        self.truncations = 0  # replica truncations so far: a cleaning planned before one is void
        # drop-behind (page_cache.py): the active segment's base and how much of it was dropped, and
        # where the segments not yet dropped whole begin (None until the first `cache_drops`)
        self._drop_base = -1
        self._drop_mark = 0
        self._dropped_before: int | None = None
        # what this log keeps of its newest bytes in the page cache, set by whoever holds the log (a
        # follower's replica: replica.drop.behind.bytes); None: the log manager's log.drop.behind.bytes
        self.cache_keep_bytes: int | None = None
        # Created by this open: the log dir's entry for it is synced with its first flush, off the
        # event loop (Kafka too defers that fsync to the flush).
        self._parent_unsynced = False
        self._epoch_load_error: StorageError | None = None
        try:
            self.leader_epoch_cache = LeaderEpochCache.load(directory)
        except StorageError as e:       # a torn rewrite is rebuilt by an unclean open (_rebuild_epochs)
            self._epoch_load_error = e
            self.leader_epoch_cache = LeaderEpochCache(directory / LEADER_EPOCH_CHECKPOINT)
        self.producer_state = ProducerStateManager(directory)

    # ---- opening ---------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Path, config: LogConfig, *, now_ms: int, recovery_point: int = 0,
             log_start_offset: int = 0, high_watermark: int = 0, needs_recovery: bool = False,
             decompress: Decompress | None = None) -> Log:
        """Open or create the log in `directory` (named <topic>-<partition>).

        With `needs_recovery` (no clean-shutdown marker) every segment from the one holding
        `recovery_point` on is re-validated by CRC and cut at the first bad batch. A future replica's
        directory (`<topic>-<partition>.<uuid>-future`, a replica being moved) opens the same way."""
        parse_log_dir_name(directory.name)
        created = not directory.is_dir()
        directory.mkdir(parents=True, exist_ok=True)
        bases = _clean_directory(directory)
        settings: dict[str, Any] = {"index_interval_bytes": config.index_interval_bytes,
                                    "max_index_bytes": config.segment_index_bytes, "now_ms": now_ms}
        segments = [LogSegment.open(directory, b, **settings) for b in bases]
        if not segments:
            segments = [LogSegment.create(directory, max(log_start_offset, 0), **settings)]
        log = cls(directory, config, segments, decompress)
        log._parent_unsynced = created
        first_recovered = log._load(recovery_point, needs_recovery)
        with log.leader_epoch_cache.held_writes(force=log._epoch_load_error is not None):
            log._rebuild_epochs(first_recovered)
            log._log_end_offset = log.active_segment.next_offset
            log._log_start_offset = min(max(log_start_offset, segments[0].base_offset),
                                        log._log_end_offset)
            log.leader_epoch_cache.truncate_from_end(log._log_end_offset)
            log.leader_epoch_cache.truncate_from_start(log._log_start_offset)
        log._recovery_point = min(max(recovery_point, 0), log._log_end_offset)
        log._high_watermark = min(max(high_watermark, log._log_start_offset), log._log_end_offset)
        log._last_flush_ms = now_ms
        load_producer_state(log, now_ms, clean_shutdown=not needs_recovery)
        return log

    def _load(self, recovery_point: int, needs_recovery: bool) -> int | None:
        """Check or recover the segments; the index of the first one recovered after an unclean
        shutdown (None after a clean one)."""
        first_unflushed = self._segment_index(recovery_point)
        for i, segment in enumerate(self._segments):
            if needs_recovery and i >= first_unflushed:
                cut = recover_segment(segment)
            elif i >= first_unflushed or not (segment.offset_index.path.exists()
                                              and segment.time_index.path.exists()):
                try:
                    segment.check_indexes()
                    continue
                except CorruptRecordError:
                    cut = recover_segment(segment)
            else:
                continue
            if cut:
                # Nothing after a torn write can be trusted.
                for later in self._segments[i + 1:]:
                    later.delete()
                del self._segments[i + 1:], self._base_offsets[i + 1:]
                break
        return min(first_unflushed, len(self._segments) - 1) if needs_recovery else None

    def _rebuild_epochs(self, first_recovered: int | None) -> None:
        """After an unclean shutdown the checkpoint may lack what was assigned since the last flush
        (epoch_cache.py): drop its entries from the first recovered segment on and assign them again
        from those segments' batches; all of them if the file itself was torn. After a clean one a
        checkpoint that cannot be read is an error, as before."""
        if self._epoch_load_error is not None:
            if first_recovered is None:
                raise self._epoch_load_error
            logger.warning("%s; rebuilding the leader epochs from the log", self._epoch_load_error)
            first_recovered = 0
        if first_recovered is None:
            return
        cache = self.leader_epoch_cache
        cache.truncate_from_end(self._segments[first_recovered].base_offset)
        for segment in self._segments[first_recovered:]:
            for b in scan_batches(segment.file.fileno(), 0, segment.size):
                cache.assign_if_newer(b.partition_leader_epoch, b.base_offset)

    # ---- state -----------------------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def update_config(self, config: LogConfig) -> None:
        self.config = config

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark, clamped to [log_start_offset, log_end_offset]; return it."""
        self._high_watermark = min(max(offset, self._log_start_offset), self._log_end_offset)
        return self._high_watermark

    def _segment_index(self, offset: int) -> int:
        """Index of the segment that would hold `offset` (the first one for smaller offsets)."""
        return max(bisect.bisect_right(self._base_offsets, offset) - 1, 0)

    # ---- appending -------------------------------------------------------------------------------

    def append(self, records, leader_epoch: int, now_ms: int,
               log_append_time: bool = False, *, coordinator: bool = False) -> LogAppendInfo:
        """Leader append of validated v2 batches: assign offsets from the log end offset by patching
        each batch's base_offset and partition_leader_epoch in place, then write them with one call.

        `records` should be writable (bytearray, memoryview of one); read-only bytes are copied once.
        With `log_append_time`, each batch's max_timestamp becomes now_ms, its timestamp type
        LogAppendTime, and its CRC is recomputed (the CRC covers those fields). A `coordinator`
        append (transactional offset commits) skips the producers' sequence checks."""
        buf, headers = self._parse(records)
        first = next_offset = self._log_end_offset
        producers = self.producer_state.prepare(
            headers, first, log_append_time_ms=now_ms if log_append_time else None, coordinator=coordinator)
        if (dup := producers.duplicate) is not None:
            return LogAppendInfo(dup.first_offset, dup.last_offset, dup.timestamp, dup.last_offset,
                                 -1, self._log_start_offset, 0, 0, duplicate=True)
        max_ts, offset_of_max = NO_TIMESTAMP, -1
        for h in headers:
            set_base_offset(buf, h.pos, next_offset)
            set_partition_leader_epoch(buf, h.pos, leader_epoch)
            last = next_offset + h.last_offset_delta
            timestamp = h.max_timestamp
            if log_append_time:
                _stamp_log_append_time(buf, h.pos, h.size, now_ms)
                timestamp = now_ms
            if timestamp > max_ts:
                max_ts, offset_of_max = timestamp, last
            next_offset = last + 1
        self._maybe_roll(len(buf), max_ts, first, next_offset - 1, now_ms).append(buf)
        self._log_end_offset = next_offset
        self._index_completed_txns(producers)
        self.producer_state.complete(producers, next_offset, now_ms)
        if leader_epoch >= 0:
            self.leader_epoch_cache.assign(leader_epoch, first)
        self._maybe_flush_messages(now_ms)
        return LogAppendInfo(first, next_offset - 1, max_ts, offset_of_max,
                             now_ms if log_append_time else -1, self._log_start_offset,
                             len(headers), len(buf))

    def append_as_follower(self, records, now_ms: int) -> LogAppendInfo:
        """Follower append: batches keep the leader's offsets and epochs; CRCs are checked here."""
        buf, headers = self._parse(records)
        if headers[0].base_offset < self._log_end_offset:
            raise UnexpectedAppendOffsetError(headers[0].base_offset, self._log_end_offset)
        next_offset = self._log_end_offset
        max_ts, offset_of_max = NO_TIMESTAMP, -1
        for h in headers:
            if h.base_offset < next_offset:
                raise CorruptRecordError(f"batch offset {h.base_offset} below {next_offset}", h.pos)
            if not h.is_valid():
                raise CorruptRecordError("batch CRC mismatch", h.pos)
            if h.max_timestamp > max_ts:
                max_ts, offset_of_max = h.max_timestamp, h.last_offset
            next_offset = h.next_offset
        first, last = headers[0].base_offset, next_offset - 1
        if last - first > 2**31 - 1:
            raise CorruptRecordError(f"offsets {first}..{last} cannot share a segment")
        producers = self.producer_state.prepare(headers, validate=False)
        self._maybe_roll(len(buf), max_ts, first, last, now_ms).append(buf)
        self._log_end_offset = next_offset
        self._index_completed_txns(producers)
        self.producer_state.complete(producers, next_offset, now_ms)
        for h in headers:
            if h.partition_leader_epoch >= 0:
                self.leader_epoch_cache.assign(h.partition_leader_epoch, h.base_offset)
        self._maybe_flush_messages(now_ms)
        return LogAppendInfo(first, last, max_ts, offset_of_max, -1, self._log_start_offset,
                             len(headers), len(buf))

    # ---- transactions ----------------------------------------------------------------------------

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest open transaction (None if none is open): the last stable
        offset is the smaller of this and the high watermark."""
        return self.producer_state.first_unstable_offset

    def _index_completed_txns(self, prepared: PreparedAppend) -> None:
        for txn in prepared.completed_txns:
            if txn.is_aborted:
                self.index_aborted_txn(txn, self.producer_state.last_stable_offset(txn))

    def index_aborted_txn(self, txn: CompletedTxn, last_stable_offset: int) -> None:
        """Record an aborted transaction in the transaction index of the segment holding its marker
        (an entry already there, replayed after recovery, is not written twice)."""
        segment = self._segments[self._segment_index(txn.last_offset)]
        segment.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset,
                                            last_stable_offset))

    def collect_aborted_transactions(self, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The aborted transactions a read_committed fetch of [fetch_offset, upper_bound_offset)
        must be told about (Kafka's collectAbortedTransactions): from the segment holding
        fetch_offset onward, until an entry shows every later one starts at or after the bound."""
        found: list[AbortedTxn] = []
        for segment in self._segments[self._segment_index(fetch_offset):]:
            if segment.base_offset >= upper_bound_offset and segment.txn_index.empty:
                continue
            entries, complete = segment.txn_index.collect(fetch_offset, upper_bound_offset)
            found += entries
            if complete:
                break
        return found

    def _parse(self, records) -> tuple[memoryview, list[BatchHeader]]:
        view = memoryview(records)
        if view.readonly:
            view = memoryview(bytearray(view))
        view = view.cast("B")
        if len(view) > self.config.segment_bytes:
            raise RecordListTooLargeError(
                f"{len(view)} bytes exceed segment.bytes {self.config.segment_bytes}")
        try:
            headers = list(iter_headers(view))
        except ProtocolError as e:
            raise CorruptRecordError(str(e)) from e
        if not headers:
            raise CorruptRecordError("no record batch to append")
        return view, headers

    def _maybe_roll(self, size: int, max_timestamp: int, first_offset: int, last_offset: int,
                    now_ms: int) -> LogSegment:
        segment = self.active_segment
        if segment.size > self.config.segment_bytes - size \
                or (segment.size > 0
                    and self._time_waited_for_roll(segment, now_ms, max_timestamp)
                    > self.config.max_segment_ms) \
                or segment.indexes_full or not segment.can_hold_offset(last_offset):
            segment = self.roll(now_ms, first_offset)
        return segment

    @staticmethod
    def _time_waited_for_roll(segment: LogSegment, now_ms: int, max_timestamp: int) -> int:
        first = segment.first_batch_timestamp
        return max_timestamp - first if first >= 0 else now_ms - segment.created_ms

    def roll(self, now_ms: int, base_offset: int | None = None) -> LogSegment:
        """Start a new active segment at max(base_offset, log_end_offset)."""
        new_base = max(base_offset or 0, self._log_end_offset)
        active = self.active_segment
        if active.base_offset == new_base:
            assert active.size == 0, "a non-empty segment already starts at the log end offset"
            return active
        active.mark_inactive()
        self._touch(active)
        segment = LogSegment.create(self.dir, new_base,
                                    index_interval_bytes=self.config.index_interval_bytes,
                                    max_index_bytes=self.config.segment_index_bytes, now_ms=now_ms)
        self._segments.append(segment)
        self._base_offsets.append(new_base)
        self.producer_state.update_map_end_offset(new_base)
        self.producer_state.take_snapshot()
        return segment

    # ---- reading ---------------------------------------------------------------------------------

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_batch: bool = True) -> list[FileSlice]:
        """File slices of whole batches from the one holding start_offset, about max_bytes in all
        (at least one whole batch when min_one_batch, even a larger one), with no batch whose last
        offset reaches max_offset (the high watermark for consumers). Empty at the log end."""
        if not self._log_start_offset <= start_offset <= self._log_end_offset:
            raise OffsetOutOfRangeError(start_offset, self._log_start_offset,
                                        self._log_end_offset, "fetch")
        end_offset = self._log_end_offset if max_offset is None \
            else min(max_offset, self._log_end_offset)
        slices: list[FileSlice] = []
        i = self._segment_index(start_offset)
        offset, remaining = start_offset, max_bytes
        while offset < end_offset and i < len(self._segments):
            segment = self._segments[i]
            piece = segment.read(offset, remaining, end_offset, min_one_batch and not slices)
            self._touch(segment)
            if piece is not None:
                if piece.length == 0:
                    break
                slices.append(piece)
                remaining -= piece.length
                if piece.position + piece.length < segment.size or remaining <= 0:
                    break
            i += 1
            if i < len(self._segments):
                offset = self._segments[i].base_offset
        return slices

    def read_bytes(self, start_offset: int, max_bytes: int, max_offset: int | None = None,
                   min_one_batch: bool = True) -> bytes:
        """`read`, copied into memory (for callers that need the bytes, not the fetch path)."""
        return b"".join(s.read() for s in self.read(start_offset, max_bytes, max_offset,
                                                    min_one_batch))

    def offset_for_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """ListOffsets by timestamp: the first record at or after log_start_offset whose timestamp
        >= `timestamp` (None if there is none). Runs the scans of `timestamp_scans` here."""
        for scan in self.timestamp_scans(timestamp):
            found = scan.run()
            if found is not None:
                return self.timestamp_and_offset(*found)
        return None

    def timestamp_scans(self, timestamp: int) -> Iterator[TimestampScan]:
        """The bounded scans (timestamps.py) that answer ListOffsets by timestamp, to run where the
        caller likes (the broker: its worker pool), in order, stopping at the first that finds a
        record: one per segment whose largest timestamp reaches `timestamp` (a header that lies
        about its max timestamp can make a segment claim what it does not hold). The budget for
        walking past lying headers is shared by the whole lookup."""
        budget = SCAN_BUDGET_BYTES
        for segment in tuple(self._segments):
            if segment.file.closed or segment.max_timestamp < timestamp:
                continue
            scan = segment.timestamp_scan(timestamp, self._log_start_offset, self.decompress, budget)
            self._touch(segment)
            yield scan
            budget = max(budget - scan.work_bytes, 0)

    def max_timestamp_scan(self) -> TimestampScan | None:
        """ListOffsets MAX_TIMESTAMP: the scan for the first record with the largest timestamp in
        the log (None when no record has a timestamp)."""
        best = max(self._segments, key=lambda s: s.max_timestamp)  # first of equals
        if best.max_timestamp == NO_TIMESTAMP:
            return None
        self._touch(best)
        return best.max_timestamp_scan(self._log_start_offset, self.decompress)

    def max_timestamp_and_offset(self) -> TimestampAndOffset | None:
        """ListOffsets MAX_TIMESTAMP, the scan run here."""
        scan = self.max_timestamp_scan()
        found = scan.run() if scan is not None else None
        return self.timestamp_and_offset(*found) if found is not None else None

    def timestamp_and_offset(self, timestamp: int, offset: int) -> TimestampAndOffset:
        """A scan's answer with the leader epoch of its offset."""
        return TimestampAndOffset(timestamp, offset, self.leader_epoch_cache.epoch_for_offset(offset))

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int] | None:
        """OffsetForLeaderEpoch: (epoch, end offset), or None when the epoch is unknown."""
        epoch, offset = self.leader_epoch_cache.end_offset_for(leader_epoch, self._log_end_offset)
        return None if offset < 0 else (epoch, offset)

    def _touch(self, segment: LogSegment) -> None:
        """Keep the indexes of the most recently used inactive segments in memory, and no more."""
        if segment is self._segments[-1]:
            return
        self._loaded_inactive[segment.base_offset] = segment
        self._loaded_inactive.move_to_end(segment.base_offset)
        while len(self._loaded_inactive) > MAX_LOADED_INACTIVE_SEGMENTS:
            _, old = self._loaded_inactive.popitem(last=False)
            if old is not self._segments[-1]:
                old.unload_indexes()

    # ---- deleting and truncating -----------------------------------------------------------------

    def delete_records_before(self, offset: int, now_ms: int) -> int:
        """DeleteRecords: move log_start_offset up to `offset` (at most the high watermark) and
        delete the segments wholly below it; return the new log start offset."""
        if not 0 <= offset <= self._high_watermark:
            raise OffsetOutOfRangeError(offset, self._log_start_offset, self._high_watermark,
                                        "DeleteRecords beyond the high watermark")
        if offset > self._log_start_offset:
            self._set_log_start_offset(offset)
            below = bisect.bisect_right(self._base_offsets, offset) - 1
            self.delete_oldest_segments(below, now_ms)
        return self._log_start_offset

    def delete_oldest_segments(self, count: int, now_ms: int) -> int:
        """Delete the `count` oldest segments (never the active one); the log then starts at the
        first remaining segment at the earliest. Policy (which ones) is the caller's: retention.py."""
        count = min(count, len(self._segments) - 1)
        if count <= 0:
            return 0
        doomed = self._segments[:count]
        del self._segments[:count], self._base_offsets[:count]
        if self._base_offsets[0] > self._log_start_offset:
            self._set_log_start_offset(self._base_offsets[0])
        for segment in doomed:
            self._schedule_delete(segment, now_ms)
        self.producer_state.delete_snapshots_before(self._base_offsets[0])
        return count

    def _set_log_start_offset(self, offset: int) -> None:
        assert offset <= self._log_end_offset
        self._log_start_offset = offset
        self._high_watermark = max(self._high_watermark, offset)
        self.leader_epoch_cache.truncate_from_start(offset)
        self.producer_state.on_log_start_offset_incremented(offset)

    def truncate_to(self, offset: int, now_ms: int) -> bool:
        """Replica truncation: remove every record at or after `offset`; False if none was there."""
        if offset < 0:
            raise ValueError(f"truncate to {offset}")
        if offset >= self._log_end_offset:
            return False
        self.truncations += 1
        if offset < self._base_offsets[0]:
            self.truncate_fully_and_start_at(offset, now_ms)
            return True
        i = self._segment_index(offset)
        for segment in self._segments[i + 1:]:
            self._schedule_delete(segment, now_ms)
        del self._segments[i + 1:], self._base_offsets[i + 1:]
        self._loaded_inactive.pop(self._segments[i].base_offset, None)
        self._segments[i].truncate_to(offset)
        self._log_end_offset = offset
        self._log_start_offset = min(self._log_start_offset, offset)
        self._recovery_point = min(self._recovery_point, offset)
        self._high_watermark = min(self._high_watermark, offset)
        self.leader_epoch_cache.truncate_from_end(offset)
        load_producer_state(self, now_ms)
        return True

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        """Delete everything; the log restarts empty at `offset` (a follower far behind)."""
        self.truncations += 1
        for segment in self._segments:
            self._schedule_delete(segment, now_ms)
        segment = LogSegment.create(self.dir, offset,
                                    index_interval_bytes=self.config.index_interval_bytes,
                                    max_index_bytes=self.config.segment_index_bytes, now_ms=now_ms)
        self._segments, self._base_offsets = [segment], [offset]
        self._log_start_offset = self._log_end_offset = offset
        self._recovery_point = self._high_watermark = offset
        self.leader_epoch_cache.clear()
        self.producer_state.truncate_fully_and_start_at(offset)

    def replace_segments(self, cleaned: LogSegment, old: list[LogSegment], now_ms: int) -> bool:
        """Swap `cleaned` (flushed, with the `.cleaned` suffix) in for the consecutive inactive
        segments `old`, which it replaces record for record minus what the cleaner removed. False,
        and nothing changed, when `old` is no longer a run of inactive segments of this log."""
        i = next((k for k, s in enumerate(self._segments) if s is old[0]), None)
        if i is None or i + len(old) >= len(self._segments) \
                or any(a is not b for a, b in zip(self._segments[i:i + len(old)], old)):
            return False
        assert cleaned.base_offset == old[0].base_offset
        for segment in old:   # the cleaner keeps markers: their aborted transactions stay indexed
            for txn in segment.txn_index.entries():
                cleaned.txn_index.append(txn)
        commit_swap(self.dir, cleaned, old)
        self._segments[i:i + len(old)] = [cleaned]
        self._base_offsets[i:i + len(old)] = [cleaned.base_offset]
        for segment in old:
            self._schedule_delete(segment, now_ms, renamed=True)
            if segment is not old[0]:  # as Kafka: no snapshot stays at an offset no segment starts at
                self.producer_state.delete_snapshot(segment.base_offset)
        return True

    def _schedule_delete(self, segment: LogSegment, now_ms: int, renamed: bool = False) -> None:
        if self._loaded_inactive.get(segment.base_offset) is segment:
            del self._loaded_inactive[segment.base_offset]
        if not renamed:
            segment.rename_to_deleted()
        if self.config.file_delete_delay_ms == 0 and not segment.pins:
            segment.delete()
        else:
            self._pending_deletes.append((now_ms + self.config.file_delete_delay_ms, segment))

    @property
    def has_pending_deletes(self) -> bool:
        """Segments set aside wait for file.delete.delay.ms (`delete_expired_files`)."""
        return bool(self._pending_deletes)

    @property
    def next_file_delete_ms(self) -> int | None:
        return min((t for t, _ in self._pending_deletes), default=None)

    def delete_expired_files(self, now_ms: int, unlink: Callable[[list[Path]], None] | None = None) -> int:
        """Close and remove `.deleted` segments whose file.delete.delay.ms has passed (and that no
        cleaning pass is reading); `unlink(paths)` removes the files if given (Segment.delete)."""
        due = [s for t, s in self._pending_deletes if t <= now_ms and not s.pins]
        if due:
            self._pending_deletes = [(t, s) for t, s in self._pending_deletes
                                     if t > now_ms or s.pins]
            for segment in due:
                segment.delete(unlink)
        return len(due)

    # ---- flushing and closing --------------------------------------------------------------------

    def flush(self, now_ms: int, up_to_offset: int | None = None) -> None:
        """fsync every segment holding offsets in [recovery_point, up_to_offset) and move the
        recovery point there (default: the log end offset)."""
        up_to = self._log_end_offset if up_to_offset is None \
            else min(up_to_offset, self._log_end_offset)
        if up_to > self._recovery_point:
            for segment in self._segments[self._segment_index(self._recovery_point):]:
                if segment.base_offset >= up_to:
                    break
                segment.flush()
            sync_file(self.leader_epoch_cache.path)
            fsync_dir(self.dir)
            self._sync_parent()
            self._recovery_point = up_to
        self._last_flush_ms = now_ms

    def _sync_parent(self) -> None:
        if self._parent_unsynced:
            fsync_dir(self.dir.parent)
            self._parent_unsynced = False

    def flush_due(self, now_ms: int) -> int | None:
        """Where the periodic flush should sync up to now: the log end after flush.ms, else the start
        of the active segment when segments were rolled since the last flush; None: nothing due."""
        if self._log_end_offset > self._recovery_point \
                and now_ms - self._last_flush_ms >= self.config.flush_ms:
            return self._log_end_offset
        if self._recovery_point < self.active_segment.base_offset:
            return self.active_segment.base_offset
        return None

    def maybe_flush(self, now_ms: int) -> bool:
        """The periodic flush, here and now (the broker's runs elsewhere: `flush_job`)."""
        up_to = self.flush_due(now_ms)
        if up_to is None:
            return False
        self.flush(now_ms, up_to)
        return True

    def flush_job(self, up_to_offset: int) -> FlushJob | None:
        """`flush` in two halves, for a sync on another thread: the index entries of the segments
        holding [recovery_point, up_to_offset) are written out now, and the job names the files to
        sync; `flushed(job)` then moves the recovery point, here. None when nothing is to sync."""
        up_to = min(up_to_offset, self._log_end_offset)
        if up_to <= self._recovery_point:
            return None
        paths: list[Path] = []
        for segment in self._segments[self._segment_index(self._recovery_point):]:
            if segment.base_offset >= up_to:
                break
            segment.offset_index.persist()
            segment.time_index.persist()
            paths += [segment.log_path, segment.offset_index.path, segment.time_index.path]
        paths.append(self.leader_epoch_cache.path)      # its entries below up_to, on disk with them
        return FlushJob(up_to, self.truncations, tuple(paths), self.dir,
                        self.dir.parent if self._parent_unsynced else None)

    def flushed(self, job: FlushJob, now_ms: int) -> None:
        """`job` ran: the recovery point moves to its end, unless the log was truncated meanwhile
        (what it synced may be gone, and what replaced it is not synced)."""
        if job.truncations == self.truncations and job.up_to > self._recovery_point:
            self._recovery_point = min(job.up_to, self._log_end_offset)
        if job.parent is not None:
            self._parent_unsynced = False
        self._last_flush_ms = now_ms

    def cache_drops(self, keep_bytes: int) -> list[tuple[Path, int]]:
        """What drop-behind should drop from the page cache now (page_cache.py), as (path, length;
        0: the whole file): the active segment's bytes before its newest `keep_bytes`, each time it
        has grown by `step_bytes(keep_bytes)` since the last drop; and the segments rolled since the
        log was opened, whole, once they are flushed and `keep_bytes` of the active segment follow."""
        active = self.active_segment
        if self._dropped_before is None:
            self._dropped_before = active.base_offset   # older files were written before this open
        if active.base_offset != self._drop_base or active.size < self._drop_mark:
            self._drop_base, self._drop_mark = active.base_offset, 0
        drops: list[tuple[Path, int]] = []
        if self._dropped_before < active.base_offset and active.size >= keep_bytes \
                and self._recovery_point >= active.base_offset:
            for segment in self._segments[self._segment_index(self._dropped_before):-1]:
                if segment.base_offset >= self._dropped_before:
                    drops.append((segment.log_path, 0))
            self._dropped_before = active.base_offset
        end = active.size - keep_bytes
        if end >= self._drop_mark + step_bytes(keep_bytes):
            drops.append((active.log_path, end))
            self._drop_mark = end
        return drops

    def _maybe_flush_messages(self, now_ms: int) -> None:
        if self._log_end_offset - self._recovery_point >= self.config.flush_messages:
            self.flush(now_ms)

    def close(self) -> None:
        """Write the indexes out (trimmed) and a producer snapshot at the log end offset, close every
        file; remove pending deletions."""
        self.producer_state.update_map_end_offset(self._log_end_offset)
        self.producer_state.take_snapshot(sync=True)
        sync_file(self.leader_epoch_cache.path)
        self._sync_parent()
        for segment in self._segments:
            segment.close()
        for _, segment in self._pending_deletes:
            segment.delete()
        self._pending_deletes.clear()

    def adopt(self, moved: Log) -> Log:
        """Become `moved` (the same partition, opened from the log dir it was moved to): whoever holds
        this object (its partition, fetches in flight) goes on with the moved log. Returns a Log
        holding what this one was, for its files to be released once no reader needs them."""
        if (moved.topic, moved.partition) != (self.topic, self.partition):
            raise ValueError(f"{moved.dir} is not a log of {self.topic}-{self.partition}")
        previous = Log.__new__(Log)
        previous.__dict__.update(self.__dict__)
        keep = self.cache_keep_bytes
        self.__dict__.update(moved.__dict__)
        self.cache_keep_bytes = keep          # the holder's choice, not the moved files'
        return previous

    def release(self) -> None:
        """Close every file without writing anything (the directory is being deleted)."""
        for segment in self._segments:
            segment.file.close()
        for _, segment in self._pending_deletes:
            segment.file.close()
        self._pending_deletes.clear()


def _stamp_log_append_time(buf: memoryview, pos: int, size: int, now_ms: int) -> None:
    attributes = _ATTRIBUTES.unpack_from(buf, pos + 21)[0] | _TIMESTAMP_TYPE_LOG_APPEND_TIME
    _ATTRIBUTES.pack_into(buf, pos + 21, attributes)
    _I64.pack_into(buf, pos + 35, now_ms)
    _U32.pack_into(buf, pos + 17, crc32c(buf[pos + 21:pos + size]))


def _clean_directory(directory: Path) -> list[int]:
    """Finish or undo an interrupted swap, remove leftovers of a previous run (.deleted, .tmp,
    orphan indexes); return segment bases."""
    recover_swaps(directory)
    bases = []
    names = os.listdir(directory)
    for name in names:
        match = _SEGMENT_NAME.match(name)
        if match:
            bases.append(int(match.group(1)))
    logs = {f"{b:020d}" for b in bases}
    for name in names:
        path = directory / name
        if name.endswith((DELETED_SUFFIX, ".tmp")):
            path.unlink(missing_ok=True)
        elif name.endswith((".index", ".timeindex", ".txnindex")) and name.split(".")[0] not in logs:
            path.unlink(missing_ok=True)
    return sorted(bases)
