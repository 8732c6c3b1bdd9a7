"""Converting between legacy message sets (magic 0/1) and v2 record batches, both ways.

The broker stores v2 only; old producers still send magic 0/1 and old consumers still fetch them.

Up-conversion, `legacy_to_v2` (layouts: `legacy`, `header`, `batch`):
- preserving offsets (the default): each compressed wrapper becomes one v2 batch with the same codec
  (or `compression` when given); runs of uncompressed messages become one uncompressed batch, cut
  where an offset does not increase or the timestamp type (or LogAppendTime value) changes. v2
  batches already in the input are copied unchanged.
- assigning offsets (`base_offset=N`, what the broker does for a Produce request, as Kafka's
  LogValidator does): every record goes into one batch with offsets N, N+1, ...; codec `compression`
  or else the first wrapper's codec.
Magic 0 records have no timestamp and get -1 (NO_TIMESTAMP). A LogAppendTime wrapper becomes a
LogAppendTime batch whose max_timestamp is the wrapper's timestamp.

Down-conversion, `v2_to_legacy` (for Fetch versions that predate v2): each v2 batch becomes one
wrapper with the batch's codec, or plain messages when it is uncompressed; zstd cannot be carried by
magic 0/1, so zstd batches come out uncompressed (Kafka instead answers UNSUPPORTED_COMPRESSION_TYPE;
the caller may check `batch.compression` first to do the same). Control batches are dropped, headers
are dropped, magic 0 drops timestamps. Legacy entries whose magic is not above the target are copied.
Offsets, keys, values and (magic 1) timestamps and timestamp types are preserved. A v2 batch is
converted by `downconvert.legacy_pieces` as one piece; Fetch v0-3 responses convert a bounded piece
at a time with it (KIP-283, `odradek.server.record_slices`), and refuse zstd batches as Kafka does.
"""

from __future__ import annotations

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.batch import RecordBatch
from odradek.records.builder import RecordBatchBuilder
from odradek.records.downconvert import legacy_pieces
from odradek.records.legacy_builder import LegacyBuilder
from odradek.records.record_set import iter_batches
from odradek.records.varint import INT32_MAX, INT64_MAX, INT64_MIN

_DEFAULT_CAP = codecs.DEFAULT_MAX_UNCOMPRESSED_BYTES


def _timestamp_key(record) -> tuple[int, int | None]:
    if record.timestamp_type == 1:
        return 1, record.timestamp
    return 0, None


def _check_convertible(records, check_offsets: bool) -> None:
    """Offsets must increase within int32 deltas and timestamps within int64 deltas, or v2 cannot
    hold the records (legacy readers do not require either, so this is checked here)."""
    first = records[0]
    previous = None
    for record in records:
        if check_offsets and (
                (previous is not None and record.offset <= previous)
                or not 0 <= record.offset - first.offset <= INT32_MAX):
            raise ProtocolError(f"message offsets do not increase within a batch's range at "
                                f"{record.offset}")
        if not INT64_MIN <= record.timestamp - first.timestamp <= INT64_MAX:
            raise ProtocolError(f"message timestamp {record.timestamp} too far from {first.timestamp}")
        previous = record.offset


def _build_v2(records, codec: int, timestamp_key: tuple[int, int | None], base_offset=None) -> bytes:
    _check_convertible(records, base_offset is None)
    timestamp_type, log_append_time = timestamp_key
    first = records[0].offset if base_offset is None else base_offset
    builder = RecordBatchBuilder(compression=codec, timestamp_type=timestamp_type, base_offset=first,
                                 log_append_time=log_append_time)
    for i, record in enumerate(records):
        offset = record.offset if base_offset is None else base_offset + i
        builder.append(record.key, record.value, timestamp=record.timestamp, offset=offset)
    return builder.build()


def legacy_to_v2(buf, *, compression: int | None = None, base_offset: int | None = None,
                 check_crc: bool = True, max_uncompressed_bytes: int = _DEFAULT_CAP,
                 allow_partial_tail: bool = False) -> bytes:
    """Up-convert a legacy message set to v2 batches (see the module docstring)."""
    if compression is not None and compression not in codecs.CODEC_NAMES:
        raise ValueError(f"unknown compression codec {compression}")
    out: list[bytes] = []
    run: list = []  # uncompressed legacy records waiting to become one batch
    run_key = None
    every: list = []  # all records, when assigning offsets
    first_codec = None

    def flush_run() -> None:
        if run:
            out.append(_build_v2(run, codecs.NONE if compression is None else compression, run_key))
            run.clear()

    for batch in iter_batches(buf, allow_partial_tail=allow_partial_tail):
        if isinstance(batch, RecordBatch):
            if base_offset is not None:
                raise ProtocolError("v2 batch in a legacy message set")
            flush_run()
            batch.ensure_valid()
            out.append(bytes(batch.buf[batch.pos:batch.pos + batch.size]))
            continue
        records = list(batch.records(check_crc=check_crc, max_uncompressed_bytes=max_uncompressed_bytes))
        if base_offset is not None:
            if first_codec is None and batch.compression:
                first_codec = batch.compression
            every.extend(records)
        elif batch.compression:
            flush_run()
            codec = batch.compression if compression is None else compression
            out.append(_build_v2(records, codec, _timestamp_key(batch)))
        else:
            record = records[0]
            key = _timestamp_key(record)
            if run and (key != run_key or record.offset <= run[-1].offset):
                flush_run()
            run_key = key
            run.append(record)
    flush_run()
    if base_offset is not None and every:
        codec = compression if compression is not None else (first_codec or codecs.NONE)
        out.append(_build_v2(every, codec, (0, None), base_offset))
    return b"".join(out)


def _legacy_entry(batch, magic: int, check_crc: bool, max_uncompressed_bytes: int) -> bytes:
    """A magic 1 entry as magic 0 messages (a v2 batch goes through `legacy_pieces`)."""
    codec = batch.compression if batch.compression in codecs.LEGACY_CODECS else codecs.NONE
    builder = LegacyBuilder(magic, compression=codec)   # magic 0: no timestamps
    previous = None
    for record in batch.records(check_crc=check_crc, max_uncompressed_bytes=max_uncompressed_bytes):
        if previous is not None and record.offset <= previous:
            raise ProtocolError(f"record offsets do not increase within the batch at {record.offset}")
        if record.offset > INT64_MAX or not INT64_MIN <= record.timestamp <= INT64_MAX:
            raise ProtocolError("record offset or timestamp does not fit in 64 bits")
        previous = record.offset
        builder.append(record.key, record.value, timestamp=record.timestamp, offset=record.offset)
    return builder.build() if len(builder) else b""


def v2_to_legacy(buf, magic: int, *, check_crc: bool = True,
                 max_uncompressed_bytes: int = _DEFAULT_CAP, allow_partial_tail: bool = False) -> bytes:
    """Down-convert a record set to a magic 0 or 1 message set (see the module docstring)."""
    _check_magic(magic)
    return b"".join(_down_convert_entry(batch, magic, check_crc, max_uncompressed_bytes)
                    for batch in iter_batches(buf, allow_partial_tail=allow_partial_tail))


def _check_magic(magic: int) -> None:
    if magic not in (0, 1):
        raise ValueError(f"legacy magic must be 0 or 1, not {magic}")


def _down_convert_entry(batch, magic: int, check_crc: bool, max_uncompressed_bytes: int) -> bytes:
    if batch.magic <= magic:
        if check_crc:
            batch.ensure_valid()
        return bytes(batch.buf[batch.pos:batch.pos + batch.size])
    if batch.is_control:
        return b""
    if isinstance(batch, RecordBatch):
        return b"".join(legacy_pieces(batch, magic, piece_bytes=INT64_MAX, check_crc=check_crc,
                                      max_uncompressed_bytes=max_uncompressed_bytes))
    return _legacy_entry(batch, magic, check_crc, max_uncompressed_bytes)
