"""Down-converting one v2 batch to legacy messages (magic 0 or 1) a bounded piece at a time.

Fetch v0-3 readers know only magic 0/1 messages (seed 004, "Message sets"); the broker stores v2 batches
(layout: `batch`), and one batch may hold a million records. `legacy_pieces` walks a batch's records
from its decompressed bytes as they come (`codecs.iter_decompress`: a bounded piece of gzip output, an
lz4 or xerial snappy block at a time), never as Python `Record` objects, and yields the messages in
pieces of about `piece_bytes`:

- uncompressed batches (and zstd ones, which magic 0/1 cannot carry: see `convert`) become plain
  messages with their absolute offsets;
- gzip, snappy and lz4 batches become one wrapper message per piece, with the batch's codec (magic 1:
  inner offsets relative to the wrapper's first record, the wrapper's offset its last record's; see
  `legacy_builder`). Kafka makes one wrapper of the whole batch; several wrappers read the same to
  every legacy reader (Java, librdkafka, kafka-python: a wrapper is a run of messages, as a compacted
  log has), and each stays as small as a piece;
- records below `min_offset` (the fetch offset) are left out, of every codec. Kafka leaves them out of
  uncompressed batches only (RecordsUtil.downConvert) and keeps a compressed batch whole; readers skip
  them either way. Here it is what lets a reader go on: its next fetch, from inside the batch, gets the
  records after those it has;
- LogAppendTime batches give LogAppendTime messages with the batch's max_timestamp (magic 1); magic 0
  has no timestamps; headers are dropped.

Every piece holds at least one whole message (a record larger than `piece_bytes` is one piece), so a
reader always gets on. Between pieces a b"" is yielded after every `STEP_RECORDS` records looked at
(converted or skipped) and after every decompressed chunk passed over, so a caller can bound the work
of one step by records as well as by bytes, and stop at any yield: what is held meanwhile is a
decompressed piece, a partial record and the messages of the current piece, plus the stored batch
unless it comes as pieces too (`convert_records`, given the header's `BatchFields` and the records
section read from a file as it goes: gzip and uncompressed batches; lz4 and snappy ones are joined
first). `Work` counts the bytes of messages made, for a caller that bounds a response's work.

The records are checked as `batch.iter_records_section` checks them (the count fills the records
exactly, each length within what remains, offsets increasing within 64 bits, key, value and header
lengths within the record); records below `min_offset` are checked only for their lengths (and, in a
batch whose offsets have gaps, their offsets). In a batch with no gaps (the last offset delta is the
count less one) the records below `min_offset` are the first ones, and records of one size are passed
over many at a time (`_pass_over`), so a fetch from deep inside a batch of a million records costs
milliseconds, not seconds.
"""

from __future__ import annotations

import struct
import zlib
from typing import Iterator

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.batch import MIN_HEADER_SIZE, MIN_RECORD_SIZE, RecordBatch
from odradek.records.header import COMPRESSION_MASK, HEADER_SIZE, MAGIC_OFFSET, TIMESTAMP_TYPE_MASK
from odradek.records.varint import INT64_MAX, INT64_MIN, read_varbytes, read_varint, read_varlong

DECOMPRESS_PIECE_BYTES = 256 * 1024   # gzip output taken per piece
STEP_RECORDS = 4096                   # records looked at between two yields
_MESSAGE_OVERHEAD = (26, 34)          # bytes of a magic 0 / magic 1 message besides key and value
_VARINT_MAX = 5
_HEADER = struct.Struct(">qiiBIhiqqqhii")     # the v2 batch header (layout: `header`)


class Work:
    """What conversions have done: `converted`, the bytes of messages made (before compression)."""

    __slots__ = ("converted",)

    def __init__(self) -> None:
        self.converted = 0


class BatchFields:
    """The header fields of a v2 batch that a conversion needs, read from its first 61 bytes (layout:
    `header`) when the rest of the batch is read from a file as it goes."""

    __slots__ = ("base_offset", "crc", "compression", "timestamp_type", "last_offset_delta", "base_timestamp",
                 "max_timestamp", "records_count")

    def __init__(self, head) -> None:
        if len(head) < HEADER_SIZE or head[MAGIC_OFFSET] != 2:
            raise ProtocolError("not a v2 batch header")
        (self.base_offset, _, _, _, self.crc, attributes, self.last_offset_delta, self.base_timestamp,
         self.max_timestamp, _, _, _, self.records_count) = _HEADER.unpack_from(head)
        self.compression = attributes & COMPRESSION_MASK
        self.timestamp_type = 1 if attributes & TIMESTAMP_TYPE_MASK else 0


def legacy_pieces(batch: RecordBatch, magic: int, *, piece_bytes: int, min_offset: int | None = None,
                  check_crc: bool = True, max_uncompressed_bytes: int = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES,
                  work: Work | None = None) -> Iterator[bytes]:
    """The batch's records as magic `magic` messages, in pieces (see the module docstring); `work`
    counts the bytes of messages made, as each piece is yielded. Raises ProtocolError for a bad CRC or
    malformed records, when reached."""
    if check_crc:
        batch.ensure_valid()
    body = memoryview(batch.buf)[batch.pos + HEADER_SIZE:batch.pos + batch.size]
    return convert_records(batch, body, magic, piece_bytes=piece_bytes, min_offset=min_offset,
                           max_uncompressed_bytes=max_uncompressed_bytes, work=work)


def convert_records(batch: BatchFields | RecordBatch, body, magic: int, *, piece_bytes: int,
                    min_offset: int | None = None,
                    max_uncompressed_bytes: int = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES,
                    work: Work | None = None) -> Iterator[bytes]:
    """`legacy_pieces` for a batch given by its header fields and its records section `body` (as
    stored: compressed), bytes-like or an iterable of pieces of it (`codecs.iter_decompress`); the
    caller has checked the CRC."""
    work = work or Work()
    if magic not in (0, 1):
        raise ValueError(f"legacy magic must be 0 or 1, not {magic}")
    codec = batch.compression if batch.compression in codecs.LEGACY_CODECS else codecs.NONE
    log_append_time = batch.max_timestamp if magic == 1 and batch.timestamp_type == 1 else None
    type_bit = TIMESTAMP_TYPE_MASK if log_append_time is not None else 0
    encode = _encoder(magic)
    chunks = codecs.iter_decompress(batch.compression, body, piece_bytes=DECOMPRESS_PIECE_BYTES,
                                    max_bytes=max_uncompressed_bytes)
    overhead = _MESSAGE_OVERHEAD[magic]
    skip_below = INT64_MIN if min_offset is None else min_offset
    count = batch.records_count
    # Offset deltas increase up to the last one: when that is count - 1, record i's delta is at most i,
    # so the first skip_below - base_offset records are all below skip_below: they are passed over by
    # their lengths alone.
    skip = max(0, min(count, skip_below - batch.base_offset)) if batch.last_offset_delta == count - 1 else 0
    # plain messages carry their absolute offsets; a wrapper's inner offsets (magic 1) are relative to
    # its first record, and its timestamp the largest of them (or the log append time)
    messages: list[bytes] = []
    add = messages.append
    first = last = max_ts = 0
    pending = 0
    looked = 0
    for record in _records(chunks, count, batch.base_offset, batch.base_timestamp, skip_below, skip):
        if record is None:           # STEP_RECORDS records skipped
            yield b""
            continue
        offset, timestamp, key, value = record
        if magic == 0:
            timestamp = -1
        elif log_append_time is not None:
            timestamp = log_append_time
        if codec == codecs.NONE:
            add(encode(offset, type_bit, timestamp, key, value))
        else:
            if not messages:
                first, max_ts = offset, timestamp
            elif timestamp > max_ts:
                max_ts = timestamp
            last = offset
            add(encode(offset - first if magic else offset, 0, timestamp, key, value))
        pending += overhead + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
        looked += 1
        if pending >= piece_bytes:
            work.converted += pending
            yield _piece(messages, codec, magic, encode, last, type_bit, max_ts)
            messages = []
            add = messages.append
            pending = looked = 0
        elif looked >= STEP_RECORDS:
            looked = 0
            yield b""
    if messages:
        work.converted += pending
        yield _piece(messages, codec, magic, encode, last, type_bit, max_ts)


_I32 = struct.Struct(">i").pack
_NULL = _I32(-1)
_ENTRY = struct.Struct(">qiI").pack         # offset, size, crc
_V0_HEAD = struct.Struct(">bb").pack        # magic, attributes
_V1_HEAD = struct.Struct(">bbq").pack       # magic, attributes, timestamp


def _encoder(magic: int):
    """encode(offset, attributes, timestamp, key, value): one message set entry (`legacy_builder`'s
    layout), made with few calls."""
    crc32 = zlib.crc32

    def encode(offset: int, attributes: int, timestamp: int, key, value) -> bytes:
        body = b"".join((_V1_HEAD(1, attributes, timestamp) if magic else _V0_HEAD(0, attributes),
                         _NULL if key is None else _I32(len(key)) + key,
                         _NULL if value is None else _I32(len(value)) + value))
        return _ENTRY(offset, 4 + len(body), crc32(body)) + body

    return encode


def _piece(messages: list[bytes], codec: int, magic: int, encode, last: int, type_bit: int, max_ts: int) -> bytes:
    """The messages as they go out: joined, or compressed into one wrapper with the last offset."""
    if codec == codecs.NONE:
        return b"".join(messages)
    inner = codecs.compress(codec, b"".join(messages), legacy_lz4=magic == 0)
    return encode(last, codec | type_bit, max_ts if magic else -1, None, inner)


def _records(chunks, count: int, base_offset: int, base_timestamp: int, skip_below: int, skip: int):
    """(offset, timestamp, key, value) of the records at or above `skip_below` of the `count` records in
    the decompressed `chunks`, which they must fill exactly; None after every STEP_RECORDS records
    skipped. The first `skip` records are passed over by their lengths alone (`_pass_over`). One-byte
    varints (most lengths and deltas) are read inline."""
    if count < 0:
        raise ProtocolError(f"record count {count} is invalid")
    buf = bytearray()
    seen = 0
    skipped = 0
    previous = INT64_MIN
    done = False
    it = iter(chunks)
    while not done:
        chunk = next(it, None)
        if chunk is None:
            done = True
        else:
            buf += chunk
        end = len(buf)
        pos = 0
        if skip:
            pos, passed = _pass_over(buf, 0, end, skip)
            seen += passed
            skip -= passed
            skipped += passed
            if skipped >= STEP_RECORDS:
                skipped = 0
                yield None
            if skip:
                if done:
                    raise ProtocolError(f"the batch declares {count} records but holds {seen}")
                del buf[:pos]
                continue
        while seen < count:
            # the length varint, inline when it is one or two bytes
            if pos + 1 < end and buf[pos] < 0x80:
                b = buf[pos]
                length, p = (b >> 1) ^ -(b & 1), pos + 1
            elif pos + 2 < end and buf[pos + 1] < 0x80:
                b = (buf[pos] & 0x7F) | (buf[pos + 1] << 7)
                length, p = (b >> 1) ^ -(b & 1), pos + 2
            elif end - pos < _VARINT_MAX and not done:
                try:
                    length, p = read_varint(buf, pos, end)
                except ProtocolError:
                    break            # the length varint goes on in the next chunk
            else:
                length, p = read_varint(buf, pos, end)
            if length < MIN_RECORD_SIZE - 1 or (done and length > end - p):
                raise ProtocolError(f"record length {length} is invalid for the bytes remaining")
            if length > end - p:
                break                # the record goes on in the next chunk
            record_end = p + length
            # attributes, then the timestamp delta and the offset delta
            q = p + 1
            b = buf[q]
            if b < 0x80 and q + 1 < record_end:
                timestamp_delta, q = (b >> 1) ^ -(b & 1), q + 1
            else:
                timestamp_delta, q = read_varlong(buf, q, record_end)
            b = buf[q] if q < record_end else 0x80
            if b < 0x80:
                offset_delta, q = (b >> 1) ^ -(b & 1), q + 1
            else:
                offset_delta, q = read_varint(buf, q, record_end)
            offset = base_offset + offset_delta
            if offset <= previous:
                raise ProtocolError(f"record offsets do not increase within the batch at {offset}")
            previous = offset
            seen += 1
            pos = record_end
            if offset < skip_below:
                skipped += 1
                if skipped >= STEP_RECORDS:
                    skipped = 0
                    yield None
                continue
            if offset > INT64_MAX:
                raise ProtocolError("record offset does not fit in 64 bits")
            timestamp = base_timestamp + timestamp_delta
            if not INT64_MIN <= timestamp <= INT64_MAX:
                raise ProtocolError("record timestamp does not fit in 64 bits")
            key, q = read_varbytes(buf, q, record_end, "key")
            value, q = read_varbytes(buf, q, record_end, "value")
            if q >= record_end or buf[q] != 0 or q + 1 != record_end:
                _skip_headers(buf, q, record_end)
            yield offset, timestamp, key, value
        if seen == count and pos != end:
            raise ProtocolError(f"{end - pos} bytes left over after the batch's records")
        del buf[:pos]
    if seen != count:
        raise ProtocolError(f"the batch declares {count} records but holds {seen}")


def _pass_over(buf, pos: int, end: int, n: int) -> tuple[int, int]:
    """Pass over up to `n` whole records from `pos` by their lengths: (the position after them, how
    many). Records of one size with a length varint of one or two bytes (a producer's usual records)
    are passed over many at a time: the length bytes at every assumed record start are compared at
    once (strided slices), which proves the chain; a mismatch halves the stretch tried, and the next
    stretch starts from what was proved (doubling while whole stretches are proved), so records of
    varied sizes cost about one comparison each."""
    done = 0
    trial = 64
    while done < n and pos < end:
        b = buf[pos]
        if b < 0x80:
            width = 1
            length = (b >> 1) ^ -(b & 1)
        elif pos + 1 < end and buf[pos + 1] < 0x80:
            width = 2
            u = (b & 0x7F) | (buf[pos + 1] << 7)
            length = (u >> 1) ^ -(u & 1)
        else:
            if end - pos < _VARINT_MAX:
                try:
                    length, p = read_varint(buf, pos, end)
                except ProtocolError:
                    break
            else:
                length, p = read_varint(buf, pos, end)
            if length < MIN_RECORD_SIZE - 1:
                raise ProtocolError(f"record length {length} is invalid")
            if length > end - p:
                break
            pos = p + length
            done += 1
            continue
        if length < MIN_RECORD_SIZE - 1:
            raise ProtocolError(f"record length {length} is invalid")
        stride = width + length
        if stride > end - pos:
            break
        run = tried = min(n - done, (end - pos) // stride, trial)
        while run > 1:
            stop = pos + run * stride
            if all(buf[pos + j:stop:stride] == buf[pos + j:pos + j + 1] * run for j in range(width)):
                break
            run //= 2
        trial = trial * 2 if run == tried else max(2, run)
        pos += run * stride
        done += run
    return pos, done


def _skip_headers(buf, pos: int, end: int) -> None:
    """Check that the headers fill the rest of the record exactly (they are dropped)."""
    count, pos = read_varint(buf, pos, end)
    if count < 0 or count > (end - pos) // MIN_HEADER_SIZE:
        raise ProtocolError(f"record headers count {count} is invalid for the bytes remaining")
    for _ in range(count):
        n, pos = read_varint(buf, pos, end)
        if n < 0 or n > end - pos:
            raise ProtocolError(f"record header key length {n} is invalid")
        pos += n
        n, pos = read_varint(buf, pos, end)
        if n < -1 or n > end - pos:
            raise ProtocolError(f"record header value length {n} is invalid")
        pos += max(n, 0)
    if pos != end:
        raise ProtocolError(f"record declared {end} bytes but used {pos}")
