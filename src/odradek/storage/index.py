"""The sparse offset index (.index) and time index (.timeindex) of one segment.

Byte layout (Kafka's), big-endian, fixed-size entries, no header:

    .index      entry 8 bytes:  relative_offset int32 (offset - segment base offset), position int32
    .timeindex  entry 12 bytes: timestamp int64, relative_offset int32

Offset index: entry (o, p) says the batch starting at byte p of the .log file has last offset o. Keys
and positions both increase strictly. One entry is added when more than `index.interval.bytes` have
been appended since the previous one, so a lookup is a binary search plus a short forward scan.

Time index: entry (t, o) says t is the largest batch max timestamp among batches up to the one whose
last offset is o, and o's batch is the first to reach t. Timestamps increase strictly (an entry is
added only when the maximum grows) and offsets never decrease. The last entry of a rolled or closed
segment holds the segment's largest timestamp.

The entries live in memory as a bytearray in exactly the file's format, and are written to the file
on flush, roll and close (never on the append path). Kafka preallocates and mmaps the files; here the
in-memory image plays that role and the file is always trimmed to its entries. Both are valid only up
to the recovery point anyway: after an unclean shutdown the indexes of every segment from the
recovery point on are rebuilt from the .log file. `segment.index.bytes` bounds the entries; a full
index makes the log roll. The index of an inactive segment can be unloaded and is read back lazily.

Indexes know nothing of partitions or policy.
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path

from odradek.storage.errors import CorruptRecordError

NO_TIMESTAMP = -1


class _Keys:
    """A read-only sequence of one int field of every entry, for bisect (C loop, Python getitem)."""

    __slots__ = ("_buf", "_unpack", "_entry_size", "_field", "_len")

    def __init__(self, buf: bytearray, entry: struct.Struct, field: int) -> None:
        self._buf = buf
        self._unpack = entry.unpack_from
        self._entry_size = entry.size
        self._field = field
        self._len = len(buf) // entry.size

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> int:
        return self._unpack(self._buf, i * self._entry_size)[self._field]


class _Index:
    ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int, *, new: bool) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // self.ENTRY.size)
        self._buf: bytearray | None = bytearray() if new else None
        self._persisted_bytes = 0  # prefix of _buf known to be in the file
        self._file_too_long = False  # the file holds entries that were truncated away
        self._last_cache: tuple[int, int] | None = None
        if new:
            with open(path, "wb"):
                pass

    # ---- loading -------------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._buf is not None

    def _entries_buf(self) -> bytearray:
        if self._buf is None:
            data = self.path.read_bytes()
            if len(data) % self.ENTRY.size:
                raise CorruptRecordError(f"{self.path}: size {len(data)} is not whole entries")
            self._buf = bytearray(data)
            self._persisted_bytes = len(data)
        return self._buf

    def load(self) -> None:
        self._entries_buf()

    def unload(self) -> None:
        """Drop the in-memory entries of a persisted index; they are read again when needed."""
        if self._buf is not None and self._persisted_bytes == len(self._buf) \
                and not self._file_too_long:
            self._buf = None

    @property
    def entries(self) -> int:
        return len(self._entries_buf()) // self.ENTRY.size

    @property
    def empty(self) -> bool:
        return self._raw_last() is None

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def entry(self, i: int) -> tuple[int, int]:
        return self.ENTRY.unpack_from(self._entries_buf(), i * self.ENTRY.size)

    def _raw_last(self) -> tuple[int, int] | None:
        """The last raw entry, read from the file's tail when the index is not loaded."""
        if self._buf is not None:
            n = len(self._buf) // self.ENTRY.size
            return self.ENTRY.unpack_from(self._buf, (n - 1) * self.ENTRY.size) if n else None
        if self._last_cache is None:
            size = self.path.stat().st_size
            if size % self.ENTRY.size:
                raise CorruptRecordError(f"{self.path}: size {size} is not whole entries")
            if size == 0:
                return None
            with open(self.path, "rb") as f:
                self._last_cache = self.ENTRY.unpack(os.pread(f.fileno(), self.ENTRY.size,
                                                              size - self.ENTRY.size))
        return self._last_cache

    # ---- changes ---------------------------------------------------------------------------------

    def _append_raw(self, a: int, b: int) -> None:
        self._entries_buf().extend(self.ENTRY.pack(a, b))
        self._last_cache = None

    def _truncate_entries(self, n: int) -> None:
        buf = self._entries_buf()
        keep = n * self.ENTRY.size
        if keep < len(buf):
            del buf[keep:]
            if keep < self._persisted_bytes:
                self._persisted_bytes = keep
                self._file_too_long = True
        self._last_cache = None

    def reset(self) -> None:
        """Forget every entry (before a rebuild)."""
        self._buf = bytearray()
        self._persisted_bytes = 0
        self._file_too_long = True
        self._last_cache = None

    def persist(self, sync: bool = False) -> None:
        """Write entries not yet in the file (and cut entries truncated away); fsync if asked."""
        buf = self._buf
        if buf is None or (self._persisted_bytes == len(buf) and not self._file_too_long
                           and not sync):
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if self._file_too_long:
                os.ftruncate(fd, self._persisted_bytes)
            tail = memoryview(buf)[self._persisted_bytes:]
            while tail:
                n = os.pwrite(fd, tail, self._persisted_bytes)
                self._persisted_bytes += n
                tail = tail[n:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self._file_too_long = False

    def rename(self, path: Path) -> None:
        os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.forget()
        self.path.unlink(missing_ok=True)

    def forget(self) -> None:
        """Drop the entries held in memory (the file is being removed)."""
        self._buf = None


class OffsetIndex(_Index):
    ENTRY = struct.Struct(">ii")

    def append(self, offset: int, position: int) -> None:
        last = self._raw_last()
        assert last is None or (offset - self.base_offset > last[0] and position > last[1]), \
            (offset, position, last)
        assert not self.is_full
        self._append_raw(offset - self.base_offset, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the largest entry whose offset <= offset, else (base, 0)."""
        buf = self._entries_buf()
        i = bisect.bisect_right(_Keys(buf, self.ENTRY, 0), offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        rel, pos = self.ENTRY.unpack_from(buf, i * self.ENTRY.size)
        return self.base_offset + rel, pos

    def lookup_by_position(self, position: int) -> tuple[int, int]:
        """(offset, position) of the largest entry whose position <= position, else (base, 0)."""
        buf = self._entries_buf()
        i = bisect.bisect_right(_Keys(buf, self.ENTRY, 1), position) - 1
        if i < 0:
            return self.base_offset, 0
        rel, pos = self.ENTRY.unpack_from(buf, i * self.ENTRY.size)
        return self.base_offset + rel, pos

    def last_entry(self) -> tuple[int, int]:
        last = self._raw_last()
        return (self.base_offset, 0) if last is None else (self.base_offset + last[0], last[1])

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset >= offset."""
        buf = self._entries_buf()
        self._truncate_entries(bisect.bisect_left(_Keys(buf, self.ENTRY, 0),
                                                  offset - self.base_offset))

    def truncate_to_position(self, position: int) -> None:
        """Remove every entry whose position >= position."""
        buf = self._entries_buf()
        self._truncate_entries(bisect.bisect_left(_Keys(buf, self.ENTRY, 1), position))


class TimeIndex(_Index):
    ENTRY = struct.Struct(">qi")

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Add (timestamp, offset) if timestamp is larger than the last entry's."""
        last = self._raw_last()
        if last is not None and timestamp <= last[0]:
            return
        assert last is None or offset - self.base_offset >= last[1], (offset, last)
        assert skip_full_check or not self.is_full
        self._append_raw(timestamp, offset - self.base_offset)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the largest entry whose timestamp <= timestamp, else (-1, base)."""
        buf = self._entries_buf()
        i = bisect.bisect_right(_Keys(buf, self.ENTRY, 0), timestamp) - 1
        if i < 0:
            return NO_TIMESTAMP, self.base_offset
        ts, rel = self.ENTRY.unpack_from(buf, i * self.ENTRY.size)
        return ts, self.base_offset + rel

    def first_above(self, timestamp: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the first entry whose timestamp > timestamp, or None."""
        buf = self._entries_buf()
        keys = _Keys(buf, self.ENTRY, 0)
        i = bisect.bisect_right(keys, timestamp)
        if i >= len(keys):
            return None
        ts, rel = self.ENTRY.unpack_from(buf, i * self.ENTRY.size)
        return ts, self.base_offset + rel

    def last_entry(self) -> tuple[int, int]:
        last = self._raw_last()
        return (NO_TIMESTAMP, self.base_offset) if last is None else \
            (last[0], self.base_offset + last[1])

    def truncate_to(self, offset: int) -> None:
        """Remove every entry whose offset >= offset."""
        buf = self._entries_buf()
        self._truncate_entries(bisect.bisect_left(_Keys(buf, self.ENTRY, 1),
                                                  offset - self.base_offset))
