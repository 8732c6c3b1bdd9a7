"""Walking the v2 batches of a segment file by their headers, with optional CRC re-validation.

The file holds v2 batches back to back, each exactly as on the wire (layout in
`odradek.records.header`): base_offset int64, batch_length int32 (bytes after this field),
partition_leader_epoch int32, magic int8 (= 2), crc uint32 (CRC-32C of bytes 21..end), attributes int16,
last_offset_delta int32, base_timestamp int64, max_timestamp int64, ... 61 header bytes, then records.

A scan reads bounded windows with `pread` (never the whole file) and yields a `BatchInfo` per batch;
only header fields are decoded. A batch that cannot be whole (too short, running past `end`, wrong
magic, failed CRC when validating, offsets going backwards) raises `CorruptRecordError` carrying the
batch's position: recovery truncates there.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from typing import NamedTuple

from odradek.records.crc import crc32c
from odradek.storage.errors import CorruptRecordError

HEADER_SIZE = 61
LOG_OVERHEAD = 12
CRC_START = 21
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
# base_offset, batch_length, partition_leader_epoch, magic, crc, attributes, last_offset_delta,
# base_timestamp, max_timestamp: the first 43 bytes.
_HEAD = struct.Struct(">qiiBIhiqq")

HEADER_WINDOW_BYTES = 16 * 1024
VALIDATE_WINDOW_BYTES = 1024 * 1024


class BatchInfo(NamedTuple):
    position: int
    size: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    partition_leader_epoch: int
    attributes: int

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def end(self) -> int:
        return self.position + self.size


def scan_batches(fd: int, start: int, end: int, *, validate: bool = False,
                 min_offset: int | None = None) -> Iterator[BatchInfo]:
    """Yield the batches in file bytes [start, end); start must be a batch boundary.

    With `validate`, every batch's CRC is checked and offsets must increase (each base offset at least
    the previous batch's next offset, and at least `min_offset`).
    """
    window_bytes = VALIDATE_WINDOW_BYTES if validate else HEADER_WINDOW_BYTES
    window = b""
    window_pos = start  # file position of window[0]
    pos = start
    next_offset = min_offset
    while pos < end:
        at = pos - window_pos
        if at + HEADER_SIZE > len(window):
            window = os.pread(fd, min(window_bytes, end - pos), pos)
            window_pos, at = pos, 0
        if len(window) - at < HEADER_SIZE:
            # Every v2 batch is at least a whole header: fewer bytes left is a torn write.
            raise CorruptRecordError("partial batch header at end of file", pos)
        (base_offset, batch_length, epoch, magic, crc, attributes, last_offset_delta,
         _base_ts, max_ts) = _HEAD.unpack_from(window, at)
        size = batch_length + LOG_OVERHEAD
        if batch_length < _MIN_BATCH_LENGTH or size > end - pos:
            raise CorruptRecordError(f"batch length {batch_length} invalid or past the end", pos)
        if magic != 2:
            raise CorruptRecordError(f"batch magic {magic}", pos)
        if last_offset_delta < 0:
            raise CorruptRecordError(f"negative last offset delta {last_offset_delta}", pos)
        if validate:
            if next_offset is not None and base_offset < next_offset:
                raise CorruptRecordError(f"offset {base_offset} below {next_offset}", pos)
            if _crc_of(fd, window, window_pos, pos + CRC_START, pos + size) != crc:
                raise CorruptRecordError("batch CRC mismatch", pos)
            next_offset = base_offset + last_offset_delta + 1
        yield BatchInfo(pos, size, base_offset, base_offset + last_offset_delta, max_ts, epoch,
                        attributes)
        pos += size


def _crc_of(fd: int, window: bytes, window_pos: int, start: int, end: int) -> int:
    """CRC-32C of file bytes [start, end): from the window when it holds them, else streamed."""
    if end - window_pos <= len(window):
        return crc32c(memoryview(window)[start - window_pos:end - window_pos])
    value = 0
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(VALIDATE_WINDOW_BYTES, end - pos), pos)
        if not chunk:
            raise CorruptRecordError("file shorter than expected", pos)
        value = crc32c(chunk, value)
        pos += len(chunk)
    return value
