"""The v2 record batch header, read and patched in place without copying.

Layout (seed 004, "Record Batch"; seed 003, "Record Batch"), big-endian, 61 bytes:

    offset  size  field
    0       8     base_offset             int64
    8       4     batch_length            int32   bytes after this field (total size - 12)
    12      4     partition_leader_epoch  int32
    16      1     magic                   int8    2
    17      4     crc                     uint32  CRC-32C of bytes 21..end
    21      2     attributes              int16   bits 0-2 codec, 3 timestamp type,
                                                  4 transactional, 5 control, 6 delete horizon
    23      4     last_offset_delta       int32
    27      8     base_timestamp          int64
    35      8     max_timestamp           int64
    43      8     producer_id             int64
    51      2     producer_epoch          int16
    53      4     base_sequence           int32
    57      4     records_count           int32
    61            records...

The CRC covers attributes onward, so the broker may rewrite base_offset and partition_leader_epoch
(which is how it assigns offsets) without recomputing it. Legacy message sets (magic 0 and 1) share
the first 17 bytes' shape: offset int64, size int32, then crc uint32 and magic int8 at byte 16.

Validation here is the broker's hot path: header fields plus one CRC-32C over a memoryview, no
per-record Python work. `set_max_timestamp` is the one patch that touches CRC-covered bytes
(LogAppendTime topics), so it recomputes the CRC.
"""

from __future__ import annotations

import struct

from odradek.protocol.exceptions import ProtocolError
from odradek.records.crc import crc32c

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base_offset + batch_length: the bytes before batch_length starts counting
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

_HEADER = struct.Struct(">qiiBIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
_PRODUCER_STATE = struct.Struct(">qhi")


class BatchHeader:
    """A view of one v2 batch's header over a buffer; `buf[pos:pos + size]` is the whole batch."""

    __slots__ = (
        "buf", "pos", "base_offset", "batch_length", "partition_leader_epoch", "magic", "crc",
        "attributes", "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id",
        "producer_epoch", "base_sequence", "records_count",
    )

    def __init__(self, buf, pos: int = 0) -> None:
        if len(buf) - pos < HEADER_SIZE:
            raise ProtocolError("record batch shorter than its 61-byte header")
        (self.base_offset, self.batch_length, self.partition_leader_epoch, self.magic, self.crc,
         self.attributes, self.last_offset_delta, self.base_timestamp, self.max_timestamp,
         self.producer_id, self.producer_epoch, self.base_sequence,
         self.records_count) = _HEADER.unpack_from(buf, pos)
        if self.magic != 2:
            raise ProtocolError(f"record batch magic {self.magic}, expected 2")
        if self.batch_length < HEADER_SIZE - LOG_OVERHEAD:
            raise ProtocolError(f"record batch length {self.batch_length} below the header size")
        if len(buf) - pos < self.batch_length + LOG_OVERHEAD:
            raise ProtocolError("record batch truncated")
        self.buf = buf
        self.pos = pos

    @property
    def size(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return (self.attributes & TIMESTAMP_TYPE_MASK) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    def compute_crc(self) -> int:
        start = self.pos + ATTRIBUTES_OFFSET
        end = self.pos + self.size
        return crc32c(memoryview(self.buf)[start:end])

    def is_valid(self) -> bool:
        return self.compute_crc() == self.crc

    def ensure_valid(self) -> None:
        """Raise ProtocolError unless the stored CRC matches the batch's bytes."""
        computed = self.compute_crc()
        if computed != self.crc:
            raise ProtocolError(
                f"record batch at offset {self.base_offset} is corrupt: stored crc {self.crc:#010x}, "
                f"computed {computed:#010x}")


def peek_offset_and_length(buf, pos: int = 0) -> tuple[int, int]:
    """The first 12 bytes of any batch or legacy message: (offset, length after these 12 bytes)."""
    if len(buf) - pos < LOG_OVERHEAD or pos < 0:
        raise ProtocolError("record set entry shorter than its 12-byte offset and length")
    return _OFFSET_AND_LENGTH.unpack_from(buf, pos)


def peek_magic(buf, pos: int = 0) -> int:
    if len(buf) - pos <= MAGIC_OFFSET or pos < 0:
        raise ProtocolError("record set entry too short to hold its magic byte")
    return buf[pos + MAGIC_OFFSET]


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Patch base_offset in place; the CRC does not cover it."""
    _I64.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    _I32.pack_into(buf, pos + 12, epoch)


def set_max_timestamp(buf: bytearray | memoryview, pos: int, timestamp_type: int,
                      max_timestamp: int) -> None:
    """Set the timestamp type bit and max_timestamp (LogAppendTime), then rewrite the CRC."""
    header = BatchHeader(buf, pos)
    attributes = (header.attributes & ~TIMESTAMP_TYPE_MASK) | (TIMESTAMP_TYPE_MASK if timestamp_type else 0)
    _I16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes)
    _I64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, max_timestamp)
    _U32.pack_into(buf, pos + CRC_OFFSET, header.compute_crc())


def set_producer_state(buf: bytearray | memoryview, pos: int, producer_id: int, producer_epoch: int,
                       base_sequence: int) -> None:
    """Set producer id, epoch and base sequence (an idempotent producer sending a batch built
    elsewhere), then rewrite the CRC."""
    header = BatchHeader(buf, pos)
    _PRODUCER_STATE.pack_into(buf, pos + PRODUCER_ID_OFFSET, producer_id, producer_epoch, base_sequence)
    _U32.pack_into(buf, pos + CRC_OFFSET, header.compute_crc())


def iter_headers(buf, pos: int = 0, end: int | None = None, *, allow_partial_tail: bool = False):
    """Yield a header per whole v2 batch in buf[pos:end]; raise ProtocolError on a bad one.

    With allow_partial_tail (Fetch responses may end in a partial batch, seed 004 "Fetch API") a
    truncated last batch ends the iteration instead of raising.
    """
    end = len(buf) if end is None else end
    while pos < end:
        if allow_partial_tail and is_partial_tail(buf, pos, end):
            return
        h = BatchHeader(buf, pos)
        if pos + h.size > end:
            raise ProtocolError("record batch runs past the end of the record set")
        yield h
        pos += h.size


def is_partial_tail(buf, pos: int, end: int) -> bool:
    """True when buf[pos:end] is too short for the entry its first 12 bytes announce."""
    if end - pos < LOG_OVERHEAD:
        return True
    length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)[1]
    return length >= 0 and end - pos - LOG_OVERHEAD < length
