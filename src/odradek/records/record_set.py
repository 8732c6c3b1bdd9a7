"""A record set: the concatenated batches of a Produce or Fetch partition (seed 004, "Message sets").

Every entry starts with offset int64 and length int32, and has its magic at byte 16, so a record set
may mix v2 batches and legacy messages (old logs do). `iter_batches` yields a `RecordBatch` (magic 2)
or a `LegacyBatch` (magic 0/1, one outer message) per entry; each is a view, nothing is decompressed
until its records are iterated. A Fetch response may end in a partial entry (seed 004, "Fetch API":
"the server is allowed to return a partial message at the end"): `allow_partial_tail=True` stops
there; otherwise a truncated entry is a ProtocolError.
"""

from __future__ import annotations

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.batch import RecordBatch
from odradek.records.header import MAGIC_OFFSET, is_partial_tail
from odradek.records.legacy import LegacyBatch


def iter_batches(buf, pos: int = 0, end: int | None = None, *, allow_partial_tail: bool = False):
    """Yield RecordBatch or LegacyBatch views over each entry of buf[pos:end]."""
    view = memoryview(buf)
    end = len(view) if end is None else end
    if end < pos or end > len(view):
        raise ProtocolError("record set bounds are invalid")
    view = view[:end]
    while pos < end:
        if is_partial_tail(view, pos, end):
            if allow_partial_tail:
                return
            raise ProtocolError("record set ends in a truncated entry")
        if end - pos <= MAGIC_OFFSET:
            raise ProtocolError("record set entry too short to hold its magic byte")
        magic = view[pos + MAGIC_OFFSET]
        if magic > 2:
            raise ProtocolError(f"record set entry with unknown magic {magic}")
        entry = RecordBatch(view, pos) if magic == 2 else LegacyBatch(view, pos)
        yield entry
        pos += entry.size


def iter_records(buf, *, include_control: bool = False, check_crc: bool = True,
                 max_uncompressed_bytes: int = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES,
                 allow_partial_tail: bool = False):
    """Every record of every batch, in order; control batches are skipped unless asked for."""
    for batch in iter_batches(buf, allow_partial_tail=allow_partial_tail):
        if batch.is_control and not include_control:
            continue
        yield from batch.records(check_crc=check_crc, max_uncompressed_bytes=max_uncompressed_bytes)


def ensure_valid(buf, *, allow_partial_tail: bool = False) -> int:
    """Check every entry's framing and CRC (no per-record work); return how many entries there are."""
    count = 0
    for batch in iter_batches(buf, allow_partial_tail=allow_partial_tail):
        batch.ensure_valid()
        count += 1
    return count
