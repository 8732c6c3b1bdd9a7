"""Recovery of segments after an unclean shutdown (no `.kafka_cleanshutdown` marker).

Data after the recovery point may be torn: the kernel wrote some pages of the tail and not others, or
garbage followed the last good batch. Recovering a segment re-reads every batch from byte 0 and
checks, in order: a whole header is present, batch_length is sane and within the file, magic is 2,
offsets increase and fit the segment, and the CRC-32C matches. At the first failure the file is cut
at that batch's position; the offset and time indexes and the tail state are rebuilt from the valid
batches only. Memory stays bounded (scan.py reads in windows and streams the CRC of large batches).

The log recovers every segment from the one holding the recovery point to the end, and deletes the
segments after the first one that had to be cut: nothing after a torn write can be trusted.
"""

from __future__ import annotations

import os

from odradek.storage.errors import CorruptRecordError
from odradek.storage.scan import scan_batches
from odradek.storage.segment import LogSegment


def recover_segment(segment: LogSegment) -> int:
    """Re-validate every batch, cut the file at the first invalid one; return the bytes cut."""
    segment.reset_for_rebuild()
    fd = segment.file.fileno()
    file_size = os.fstat(fd).st_size
    segment.size = file_size
    valid_end = 0
    try:
        for b in scan_batches(fd, 0, file_size, validate=True, min_offset=segment.base_offset):
            if not segment.can_hold_offset(b.last_offset):
                raise CorruptRecordError(f"offset {b.last_offset} beyond the segment", b.position)
            segment.index_batch(b)
            valid_end = b.end
    except CorruptRecordError:
        pass
    cut = file_size - valid_end
    if cut:
        segment.truncate_to_position(valid_end)
    segment.txn_index.truncate_to(segment.next_offset)   # markers cut with the tail
    return cut
