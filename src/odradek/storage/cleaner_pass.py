"""One cleaning pass over one log: build the offset map of its dirty section, then recopy its segments
group by group into `.cleaned` segments (seed 003, "Log Compaction Details"; Kafka's Cleaner.doClean).

A pass works from a `CleanPlan` taken on the log's owner thread (the segments below the first
uncleanable offset, each pinned so its file stays open, their sizes, the active producers, the
settings, the time). It runs on a cleaner thread and touches nothing shared: it reads the old
segments' files with `pread` through their descriptors and writes new files of its own. Its output is
a sequence of `CleanedGroup`s, each a flushed segment with the `.cleaned` suffix to be swapped in by
the owner thread (cleaner_swap.py), and finally the end offset: the first dirty offset of the next
pass (the map's latest offset + 1).

- The map covers [first dirty offset, first uncleanable offset) batch by batch until it is full;
  what it could not hold stays dirty for the next pass (cleaning in passes).
- The recopied range is every segment with base offset below the end offset, from the first one:
  the clean section too, since a key's old record there goes when the dirty section has a newer one.
- Segments are grouped, in order, while the group's bytes stay within `segment.bytes` and its offsets
  within an int32 of its base (so an index entry can hold them); a group becomes one segment with the
  first one's base offset and the last one's modification time.
- Reads and writes go through a `Throttler` (`log.cleaner.io.max.bytes.per.second`) and check for an
  abort between reads, so a broker stop or a deleted partition ends a pass within one read.
- The pass is pure Python and holds the GIL while it works; left alone, the interpreter would hand
  the GIL to the event loop only every `sys.getswitchinterval()` (5 ms), adding that much to every
  request. So after each `GIL_SLICE_S` of work it sleeps `GIL_YIELD_S`: the loop takes the GIL when it
  wants it, and the cleaner gets the rest.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from odradek.storage.cleaner_records import HEADER, RETAIN_ALL, FilterContext, OffsetMap, \
    TransactionFilter, filter_batch, map_batch
from odradek.storage.cleaner_swap import fault_point
from odradek.storage.errors import CorruptRecordError
from odradek.storage.scan import HEADER_SIZE, LOG_OVERHEAD
from odradek.storage.segment import CLEANED_SUFFIX, INT_MAX, LogSegment, segment_file_name

if TYPE_CHECKING:
    from odradek.storage.log import Log

log = logging.getLogger("odradek.storage.cleaner")

GIL_SLICE_S = 0.001
GIL_YIELD_S = 0.00005


class CleaningAborted(Exception):
    """The pass was asked to stop (broker shutdown, partition deleted, log changed)."""


@dataclass(frozen=True, slots=True)
class SegmentSource:
    """An old segment as the pass sees it: fixed at plan time."""

    segment: LogSegment     # identity, and the descriptor of its file (pinned open)
    base_offset: int
    size: int
    next_base_offset: int   # base of the segment after it, or the first uncleanable offset
    last_modified_ms: int
    dirty_position: int     # where the dirty section starts in this file (0 if it starts before)

    @property
    def fd(self) -> int:
        return self.segment.file.fileno()


@dataclass(slots=True)
class CleanPlan:
    topic_partition: tuple[str, int]
    directory: Path
    first_dirty_offset: int
    first_uncleanable_offset: int
    now_ms: int
    sources: list[SegmentSource]                # every segment below the first uncleanable offset
    producers: dict[int, tuple[int, int]]       # active producer -> (last data offset, epoch)
    segment_bytes: int
    segment_index_bytes: int
    index_interval_bytes: int
    delete_retention_ms: int
    truncations: int                            # the log's truncation count at plan time
    log: Log | None = None                      # the Log, for the owner thread only
    aborted: bool = False                       # set by the owner thread
    # Transactions (to come): a new filter for each phase of the pass, fed the batches in offset
    # order; it will read the log's aborted transactions, which the plan then has to carry.
    new_txn_filter: Callable[[], TransactionFilter] = lambda: RETAIN_ALL


@dataclass(slots=True)
class PassStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    map_records: int = 0
    map_bytes_read: int = 0
    buffer_utilization: float = 0.0
    cpu_s: float = 0.0
    earliest_horizon_ms: int | None = None


@dataclass(slots=True)
class CleanedGroup:
    plan: CleanPlan
    cleaned: LogSegment
    sources: list[SegmentSource]


@dataclass(slots=True)
class PassResult:
    end_offset: int
    stats: PassStats = field(default_factory=PassStats)


class Throttler:
    """Sleeps (through `wait`, which returns True when asked to stop) to keep the bytes observed
    under `bytes_per_second`, measured over windows of `check_interval_s` (Kafka's Throttler)."""

    def __init__(self, bytes_per_second: float, wait: Callable[[float], bool],
                 clock: Callable[[], float] = time.monotonic, check_interval_s: float = 0.3) -> None:
        self.bytes_per_second = bytes_per_second
        self.wait = wait
        self.clock = clock
        self.check_interval_s = check_interval_s
        self._start = clock()
        self._observed = 0

    def maybe_throttle(self, nbytes: int) -> None:
        self._observed += nbytes
        now = self.clock()
        elapsed = now - self._start
        if elapsed < self.check_interval_s:
            return
        sleep_s = self._observed / self.bytes_per_second - elapsed
        if sleep_s > 0 and self.wait(sleep_s):
            raise CleaningAborted("stopped while throttled")
        self._start, self._observed = self.clock(), 0


class _Pass:
    def __init__(self, plan: CleanPlan, offset_map: OffsetMap, io_buffer_size: int,
                 throttler: Throttler, stopped: Callable[[], bool]) -> None:
        self.plan = plan
        self.map = offset_map
        self.io_buffer_size = io_buffer_size
        self.throttler = throttler
        self.stopped = stopped
        self.stats = PassStats()
        self._slice_start = time.perf_counter()

    def batches(self, source: SegmentSource, position: int) -> Iterator[bytes]:
        """Each whole batch of the file from `position`, read in windows of the I/O buffer size."""
        size = source.size
        perf_counter = time.perf_counter
        while position < size:
            if self.stopped() or self.plan.aborted:
                raise CleaningAborted(f"{self.plan.topic_partition}: cleaning aborted")
            window = os.pread(source.fd, min(self.io_buffer_size, size - position), position)
            at = 0
            while len(window) - at >= HEADER_SIZE:
                batch_size = HEADER.unpack_from(window, at)[1] + LOG_OVERHEAD
                if batch_size < HEADER_SIZE or window[at + 16] != 2:
                    raise CorruptRecordError(f"{source.segment}: bad batch at {position + at}")
                if at + batch_size > len(window):
                    break
                yield window[at:at + batch_size]
                at += batch_size
                if perf_counter() - self._slice_start >= GIL_SLICE_S:
                    time.sleep(GIL_YIELD_S)
                    self._slice_start = perf_counter()
            if at == 0:  # a batch larger than the buffer: read it alone
                if len(window) < HEADER_SIZE:
                    raise CorruptRecordError(f"{source.segment}: truncated at {position}")
                batch_size = HEADER.unpack_from(window, 0)[1] + LOG_OVERHEAD
                if batch_size > size - position:
                    raise CorruptRecordError(f"{source.segment}: batch past the end at {position}")
                window = os.pread(source.fd, batch_size, position)
                if len(window) != batch_size:
                    raise CorruptRecordError(f"{source.segment}: truncated at {position}")
                yield window
                at = batch_size
            position += at
            self.stats.bytes_read += at
            self.throttler.maybe_throttle(at)

    def build_offset_map(self) -> None:
        plan, offset_map = self.plan, self.map
        offset_map.clear(latest_offset=plan.first_dirty_offset - 1)
        txn = plan.new_txn_filter()
        first = True  # the first batch is mapped whole even past the budget: a pass must progress
        for source in plan.sources:
            if source.next_base_offset <= plan.first_dirty_offset:
                continue
            start_bytes = self.stats.bytes_read
            for batch in self.batches(source, source.dirty_position):
                fields = HEADER.unpack_from(batch, 0)
                if fields[0] + fields[6] < plan.first_dirty_offset:
                    continue
                full, records = map_batch(batch, offset_map, plan.first_dirty_offset, first, txn)
                first = False
                self.stats.map_records += records
                if full:
                    self.stats.map_bytes_read += self.stats.bytes_read - start_bytes
                    self.stats.buffer_utilization = offset_map.utilization
                    return
            self.stats.map_bytes_read += self.stats.bytes_read - start_bytes
        self.stats.buffer_utilization = offset_map.utilization

    def clean_group(self, group: list[SegmentSource], ctx: FilterContext) -> LogSegment:
        plan = self.plan
        base = group[0].base_offset
        for suffix in (".log", ".index", ".timeindex"):
            (plan.directory / (segment_file_name(base, suffix) + CLEANED_SUFFIX)).unlink(missing_ok=True)
        cleaned = LogSegment.create(plan.directory, base, index_interval_bytes=plan.index_interval_bytes,
                                    max_index_bytes=plan.segment_index_bytes, now_ms=plan.now_ms,
                                    suffix=CLEANED_SUFFIX)
        try:
            out = bytearray()
            for source in group:
                for batch in self.batches(source, 0):
                    kept = filter_batch(batch, ctx)
                    if kept is not None:
                        out += kept
                    if len(out) >= self.io_buffer_size:
                        self._write(cleaned, out)
                        out = bytearray()
            if out:
                self._write(cleaned, out)
            fault_point("cleaned-written")
            cleaned.mark_inactive()
            cleaned.flush()
            cleaned.set_last_modified_ms(group[-1].last_modified_ms)
            fault_point("cleaned-flushed")
        except Exception:
            cleaned.delete()
            raise
        return cleaned

    def _write(self, cleaned: LogSegment, out: bytearray) -> None:
        cleaned.append(memoryview(out))
        self.stats.bytes_written += len(out)
        self.throttler.maybe_throttle(len(out))


def group_segments(sources: list[SegmentSource], max_bytes: int) -> list[list[SegmentSource]]:
    """Consecutive segments whose bytes fit `max_bytes` and whose offsets fit an int32 from the
    group's base (a segment's last offset is bounded by the next one's base)."""
    groups: list[list[SegmentSource]] = []
    i = 0
    while i < len(sources):
        group = [sources[i]]
        size = sources[i].size
        i += 1
        while i < len(sources) and size + sources[i].size <= max_bytes \
                and (sources[i].size == 0
                     or sources[i].next_base_offset - 1 - group[0].base_offset <= INT_MAX):
            group.append(sources[i])
            size += sources[i].size
            i += 1
        groups.append(group)
    return groups


def run_clean(plan: CleanPlan, offset_map: OffsetMap, *, io_buffer_size: int,
              throttler: Throttler, stopped: Callable[[], bool]
              ) -> Generator[CleanedGroup, None, PassResult]:
    """Clean the plan's log; yield each cleaned group as it is ready, return a `PassResult`."""
    cpu_start = time.thread_time()
    work = _Pass(plan, offset_map, io_buffer_size, throttler, stopped)
    work.build_offset_map()
    fault_point("map-built")
    end_offset = offset_map.latest_offset + 1
    ctx = FilterContext(offset_map, plan.now_ms, plan.delete_retention_ms, plan.producers,
                        plan.first_uncleanable_offset, plan.new_txn_filter())
    sources = [s for s in plan.sources if s.base_offset < end_offset]
    for group in group_segments(sources, plan.segment_bytes):
        cleaned = work.clean_group(group, ctx)
        yield CleanedGroup(plan, cleaned, group)
    stats = work.stats
    stats.records_read, stats.records_written = ctx.records_read, ctx.records_kept
    stats.earliest_horizon_ms = ctx.earliest_horizon_ms
    stats.cpu_s = time.thread_time() - cpu_start
    if ctx.malformed_batches:
        log.warning("%s-%d: %d batches could not be read and were copied as they are",
                    *plan.topic_partition, ctx.malformed_batches)
    return PassResult(end_offset, stats)
