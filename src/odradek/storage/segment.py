"""LogSegment: one `.log` file of whole v2 batches plus its `.index` and `.timeindex`.

Files, in the partition directory, named by the segment's base offset zero-padded to 20 digits:

    00000000000000000000.log        v2 batches back to back, exactly as on the wire (see scan.py)
    00000000000000000000.index      OffsetIndex (see index.py)
    00000000000000000000.timeindex  TimeIndex (see index.py)
    00000000000000000000.txnindex   TransactionIndex, aborted transactions (see txn_index.py)

A segment the cleaner is writing carries a suffix after each name (`.cleaned`, then `.swap` while it
is being swapped in; see cleaner_swap.py); `change_suffix` renames the indexes first and the `.log`
file last, so the `.log` file's name is the one recovery goes by.

Invariants:
- every batch in the file has base_offset >= base_offset, offsets increase from batch to batch, and
  last_offset - base_offset fits an int32 (the index stores relative offsets);
- `size` is the length of the file's valid prefix and stays below 2 GiB (index positions are int32);
- an append is one `pwrite` of already-validated bytes at `size`; the file is never rewritten in place
  except by truncation (replica truncation, recovery);
- index entries point at batch starts within `size`;
- a segment with `pins` > 0 is being read by the cleaner: its file stays open until unpinned;
- `_recent` holds the headers of the last batches appended in this process, back to back up to
  `size`: a read at or near the log end (every follower's and every caught-up consumer's fetch) finds
  its batches there, with no index lookup and no read of the file's headers. Anything that cuts the
  file forgets them.

A segment decides no policy: rolling, retention, recovery and flushing are decided by the log and the
modules that use segments.
"""

from __future__ import annotations

import io
import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from odradek.records.header import iter_headers
from odradek.storage.errors import CorruptRecordError, StorageError
from odradek.storage.fileslice import FileSlice
from odradek.storage.index import NO_TIMESTAMP, OffsetIndex, TimeIndex
from odradek.storage.scan import BatchInfo, scan_batches
from odradek.storage.timestamps import SCAN_BUDGET_BYTES, Decompress, TimestampScan
from odradek.storage.txn_index import TXN_INDEX_SUFFIX, TransactionIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
INT_MAX = 2**31 - 1
RECENT_BATCHES = 64   # headers of the latest appends kept for reads at the log end (at most twice that)


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class LogSegment:
    def __init__(self, directory: Path, base_offset: int, *, index_interval_bytes: int,
                 max_index_bytes: int, now_ms: int, new: bool, suffix: str = "") -> None:
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = directory / (segment_file_name(base_offset, LOG_SUFFIX) + suffix)
        self.created_ms = now_ms
        self.pins = 0  # cleaner passes reading this segment's file (changed on the log's thread)
        opener = (lambda p, f: os.open(p, f | os.O_CREAT | os.O_EXCL, 0o644)) if new else None
        self.file = io.FileIO(self.log_path, "r+", opener=opener)
        self.size = os.fstat(self.file.fileno()).st_size
        self.offset_index = OffsetIndex(
            directory / (segment_file_name(base_offset, INDEX_SUFFIX) + suffix), base_offset,
            max_index_bytes, new=new)
        self.time_index = TimeIndex(
            directory / (segment_file_name(base_offset, TIME_INDEX_SUFFIX) + suffix), base_offset,
            max_index_bytes, new=new)
        self.txn_index = TransactionIndex(
            directory / (segment_file_name(base_offset, TXN_INDEX_SUFFIX) + suffix))
        if new:
            self.txn_index.reset()   # a leftover of a segment that once started here
        # Tail state: known after an append, a recovery or a lazy scan from the last index entry.
        self._next_offset: int | None = base_offset if new else None
        self._max_timestamp = NO_TIMESTAMP
        self._offset_of_max_timestamp = -1
        self._bytes_since_last_index_entry = 0
        self._first_batch_timestamp: int | None = NO_TIMESTAMP if new else None
        self._recent: list[BatchInfo] = []
        self._recent_last: list[int] = []    # their last offsets, for bisect

    @classmethod
    def create(cls, directory: Path, base_offset: int, *, index_interval_bytes: int,
               max_index_bytes: int, now_ms: int, suffix: str = "") -> LogSegment:
        return cls(directory, base_offset, index_interval_bytes=index_interval_bytes,
                   max_index_bytes=max_index_bytes, now_ms=now_ms, new=True, suffix=suffix)

    @classmethod
    def open(cls, directory: Path, base_offset: int, *, index_interval_bytes: int,
             max_index_bytes: int, now_ms: int) -> LogSegment:
        """Open existing files; indexes load lazily. Call `check_indexes` or recover before use."""
        return cls(directory, base_offset, index_interval_bytes=index_interval_bytes,
                   max_index_bytes=max_index_bytes, now_ms=now_ms, new=False)

    def __repr__(self) -> str:
        return f"LogSegment({self.log_path.name}, size={self.size})"

    # ---- state -----------------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """One past the last offset in this segment (the base offset when empty)."""
        self._ensure_tail_state()
        assert self._next_offset is not None
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        """The largest batch max_timestamp in the segment, -1 if none."""
        self._ensure_tail_state()
        return self._max_timestamp

    @property
    def offset_of_max_timestamp(self) -> int:
        """Last offset of the first batch that reached `max_timestamp` (-1 if none)."""
        self._ensure_tail_state()
        return self._offset_of_max_timestamp

    @property
    def first_batch_timestamp(self) -> int:
        """The first batch's max timestamp (what `segment.ms` counts from), -1 if none."""
        if self._first_batch_timestamp is None:
            first = next(self.batches(0), None)
            self._first_batch_timestamp = NO_TIMESTAMP if first is None else first.max_timestamp
        return self._first_batch_timestamp

    @property
    def indexes_full(self) -> bool:
        return self.offset_index.is_full or self.time_index.is_full

    def can_hold_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT_MAX

    def check_indexes(self) -> None:
        """Cheap consistency checks of persisted indexes; CorruptRecordError means rebuild."""
        for index in (self.offset_index, self.time_index):
            if not index.path.exists():
                raise CorruptRecordError(f"{index.path} missing")
        offset, position = self.offset_index.last_entry()
        _, ts_offset = self.time_index.last_entry()
        self._ensure_tail_state()
        if not self.offset_index.empty and not (
                self.base_offset <= offset < self.next_offset and 0 < position < self.size):
            raise CorruptRecordError(f"{self.offset_index.path}: last entry {offset}@{position}")
        if not self.time_index.empty and not self.base_offset <= ts_offset < self.next_offset:
            raise CorruptRecordError(f"{self.time_index.path}: last entry offset {ts_offset}")

    def _ensure_tail_state(self) -> None:
        if self._next_offset is not None:
            return
        # Up to the last offset-index entry the time index already holds the maximum (an entry is
        # added to it whenever one is added to the offset index), so only the tail needs a scan.
        _, position = self.offset_index.last_entry()
        max_ts, max_offset = self.time_index.last_entry()
        if max_ts == NO_TIMESTAMP:
            max_offset = -1
        next_offset = self.base_offset
        for b in self.batches(position):
            if b.max_timestamp > max_ts:
                max_ts, max_offset = b.max_timestamp, b.last_offset
            next_offset = b.next_offset
        self._next_offset = next_offset
        self._max_timestamp, self._offset_of_max_timestamp = max_ts, max_offset
        self._bytes_since_last_index_entry = self.size - position

    # ---- writing ---------------------------------------------------------------------------------

    def append(self, records: memoryview) -> None:
        """Write whole, offset-assigned, validated v2 batches with one pwrite; update the indexes."""
        start = self.size
        batches = [BatchInfo(start + h.pos, h.size, h.base_offset, h.last_offset, h.max_timestamp,
                             h.partition_leader_epoch, h.attributes) for h in iter_headers(records)]
        if not batches:
            return
        assert self.size + len(records) <= INT_MAX
        assert batches[0].base_offset >= self.next_offset and self.can_hold_offset(batches[-1].last_offset)
        fd = self.file.fileno()
        written = 0
        try:
            while written < len(records):
                written += os.pwrite(fd, records[written:], start + written)
        except OSError as e:
            os.ftruncate(fd, start)
            raise StorageError(f"{self.log_path}: append failed: {e}") from e
        self.size = start + written
        if start == 0:
            self._first_batch_timestamp = batches[0].max_timestamp
        for b in batches:
            self._index_batch(b.position, b.size, b.last_offset, b.max_timestamp)
        self._remember(batches)

    def _remember(self, batches: list[BatchInfo]) -> None:
        recent, last = self._recent, self._recent_last
        if len(batches) >= RECENT_BATCHES or (recent and recent[-1].end != batches[0].position):
            self._forget_recent()
            batches = batches[-RECENT_BATCHES:]
        elif len(recent) + len(batches) > 2 * RECENT_BATCHES:
            drop = len(recent) + len(batches) - RECENT_BATCHES
            del recent[:drop]
            del last[:drop]
        recent.extend(batches)
        last.extend(b.last_offset for b in batches)

    def _forget_recent(self) -> None:
        self._recent.clear()
        self._recent_last.clear()

    def index_batch(self, b: BatchInfo) -> None:
        """Account for a batch already in the file (recovery rebuilds the indexes with this)."""
        if b.position == 0:
            self._first_batch_timestamp = b.max_timestamp
        self._index_batch(b.position, b.size, b.last_offset, b.max_timestamp)

    def _index_batch(self, position: int, size: int, last_offset: int, max_timestamp: int) -> None:
        if max_timestamp > self._max_timestamp:
            self._max_timestamp, self._offset_of_max_timestamp = max_timestamp, last_offset
        # A full index only gets sparser; the log rolls before the next append.
        if self._bytes_since_last_index_entry > self.index_interval_bytes \
                and not self.indexes_full:
            self.offset_index.append(last_offset, position)
            if self._max_timestamp != NO_TIMESTAMP:
                self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += size
        self._next_offset = last_offset + 1

    def reset_for_rebuild(self) -> None:
        """Forget indexes and tail state before `index_batch` is called for every valid batch."""
        self.offset_index.reset()
        self.time_index.reset()
        self._next_offset = self.base_offset
        self._max_timestamp, self._offset_of_max_timestamp = NO_TIMESTAMP, -1
        self._bytes_since_last_index_entry = 0
        self._first_batch_timestamp = NO_TIMESTAMP
        self._forget_recent()

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset >= offset; return the bytes removed."""
        first = self.find_batch(offset)
        if first is None:
            return 0
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        removed = self.truncate_to_position(first.position)
        self._next_offset = None  # recomputed from the remaining indexes and the tail
        return removed

    def truncate_to_position(self, position: int) -> int:
        """Cut the file at `position`; index entries must already end before it."""
        removed = self.size - position
        self._forget_recent()
        os.ftruncate(self.file.fileno(), position)
        self.size = position
        assert self.offset_index.last_entry()[1] < max(position, 1)
        if position == 0:
            self._first_batch_timestamp = NO_TIMESTAMP
        return removed

    def mark_inactive(self) -> None:
        """On roll: record the largest timestamp in the time index and write the indexes out."""
        if self.max_timestamp != NO_TIMESTAMP:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp,
                                         skip_full_check=True)
        self.offset_index.persist()
        self.time_index.persist()

    def flush(self) -> None:
        os.fsync(self.file.fileno())
        self.offset_index.persist(sync=True)
        self.time_index.persist(sync=True)

    def unload_indexes(self) -> None:
        self.offset_index.unload()
        self.time_index.unload()

    # ---- reading ---------------------------------------------------------------------------------

    def batches(self, position: int = 0, end: int | None = None) -> Iterator[BatchInfo]:
        return scan_batches(self.file.fileno(), position, self.size if end is None else end)

    def find_batch(self, offset: int) -> BatchInfo | None:
        """The first batch whose last offset >= offset, or None."""
        recent = self._recent
        if recent and offset >= recent[0].base_offset:
            # Every batch before recent[0] ends below its base offset, so the answer is among them.
            i = bisect_left(self._recent_last, offset)
            return recent[i] if i < len(recent) else None
        _, position = self.offset_index.lookup(offset)
        for b in self.batches(position):
            if b.last_offset >= offset:
                return b
        return None

    def read(self, start_offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_batch: bool = True) -> FileSlice | None:
        """Whole batches from the one holding start_offset, at most max_bytes (but one batch when
        min_one_batch), none with last offset >= max_offset. None: no batch at/after start_offset."""
        first = self.find_batch(start_offset)
        if first is None:
            return None
        end_bound = self.size
        if max_offset is not None:
            if first.last_offset >= max_offset:
                return FileSlice(self.file, first.position, 0)
            if max_offset < self.next_offset:
                cut = self.find_batch(max_offset)
                if cut is not None:
                    end_bound = cut.position
        limit = first.position + max(max_bytes, 0)
        if limit >= end_bound:
            end = end_bound
        else:
            end = self._boundary_at_or_before(limit, first.position)
            if end == first.position and min_one_batch:
                end = first.end
        return FileSlice(self.file, first.position, end - first.position)

    def _boundary_at_or_before(self, limit: int, start: int) -> int:
        _, position = self.offset_index.lookup_by_position(limit)
        boundary = max(position, start)
        for b in self.batches(boundary):
            if b.end > limit:
                break
            boundary = b.end
        return boundary

    def read_bytes(self, position: int, length: int) -> bytes:
        return FileSlice(self.file, position, length).read()

    def find_offset_by_timestamp(self, timestamp: int, min_offset: int,
                                 decompress: Decompress | None = None) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record >= min_offset with timestamp >= the target."""
        return self.timestamp_scan(timestamp, min_offset, decompress).run()

    def timestamp_scan(self, timestamp: int, min_offset: int, decompress: Decompress | None = None,
                       budget_bytes: int = SCAN_BUDGET_BYTES) -> TimestampScan:
        """Plan the search for the first record >= min_offset with timestamp >= the target.

        Time index entry (t, o) says o's batch is the first to reach t, and the entries are written
        when offset index entries are. So with the last entry at or below the target (t_i, o_i) and the
        first above it (t', o'): if t_i is the target, o_i's batch holds the answer; else the answer
        lies after the last offset index entry before o' (the running maximum there was below the
        target) and at or before o'. With no entry above, it lies in the unindexed tail."""
        ts, ts_offset = self.time_index.lookup(timestamp)
        start = self.offset_index.lookup(max(ts_offset, min_offset))[1]
        until: int | None = ts_offset
        if ts != timestamp:
            above = self.time_index.first_above(timestamp)
            if above is None:
                until = None
                start = max(start, self.offset_index.last_entry()[1])
            else:
                until = above[1]
                start = max(start, self.offset_index.lookup(until - 1)[1])
        return TimestampScan(self._own_reader(), start, self.size, until, timestamp, min_offset,
                             decompress, budget_bytes)

    def max_timestamp_scan(self, min_offset: int, decompress: Decompress | None = None) -> TimestampScan:
        """Plan the search for the first record holding the segment's largest timestamp: it is in the
        batch whose last offset is `offset_of_max_timestamp`, and nowhere else."""
        until = self.offset_of_max_timestamp
        start = self.offset_index.lookup(max(until, min_offset))[1]
        return TimestampScan(self._own_reader(), start, self.size, until, self.max_timestamp,
                             min_offset, decompress, 0, conservative=False)

    def _own_reader(self) -> io.FileIO:
        """A read-only file on a duplicate descriptor: a scan on another thread keeps reading the
        same file even if the segment is closed, deleted or swapped meanwhile."""
        return io.FileIO(os.dup(self.file.fileno()), "r", closefd=True)

    # ---- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        if self.file.closed:
            return
        if self._next_offset is not None:
            self.mark_inactive()
        self.file.close()

    def change_suffix(self, old: str, new: str, between: Callable[[], None] | None = None) -> None:
        """Rename `<name><old>` to `<name><new>` for the indexes, then (after calling `between`)
        for the .log file."""
        for index in (self.offset_index, self.time_index, self.txn_index):
            index.rename(_replace_suffix(index.path, old, new))
        if between is not None:
            between()
        os.replace(self.log_path, _replace_suffix(self.log_path, old, new))
        self.log_path = _replace_suffix(self.log_path, old, new)

    @property
    def last_modified_ms(self) -> int:
        return int(os.stat(self.file.fileno()).st_mtime * 1000)

    def set_last_modified_ms(self, ms: int) -> None:
        """Set the .log file's mtime (retention falls back on it for segments without timestamps)."""
        os.utime(self.file.fileno(), ns=(ms * 1_000_000, ms * 1_000_000))

    def rename_to_deleted(self) -> None:
        """First step of deletion: open slices keep reading through the still-open descriptor."""
        deleted = self.log_path.with_name(self.log_path.name + DELETED_SUFFIX)
        os.replace(self.log_path, deleted)
        self.log_path = deleted
        for index in (self.offset_index, self.time_index, self.txn_index):
            if index.path.exists():
                index.rename(index.path.with_name(index.path.name + DELETED_SUFFIX))

    def delete(self, unlink: Callable[[list[Path]], None] | None = None) -> None:
        """Close the segment and remove its files: here, or by `unlink(paths)` (the log manager hands
        them to its sync thread, since unlinking a file whose pages are cached frees them all, about
        a quarter of a second per cached GiB)."""
        self.file.close()
        paths = [self.log_path, self.offset_index.path, self.time_index.path, self.txn_index.path]
        self.offset_index.forget()
        self.time_index.forget()
        self.txn_index.forget()
        (unlink or unlink_files)(paths)


def unlink_files(paths: Iterable[Path]) -> None:
    """Remove each file that exists."""
    for path in paths:
        path.unlink(missing_ok=True)


def _replace_suffix(path: Path, old: str, new: str) -> Path:
    name = path.name
    assert name.endswith(old), (path, old)
    return path.with_name(name[:len(name) - len(old)] + new if old else name + new)
