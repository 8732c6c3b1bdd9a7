"""The cleaner's record-level work: the key -> last offset map, and recopying one batch without the
records a later one of the same key makes redundant (seed 003, "Log Compaction Details"; Kafka's
LogCleaner.cleanInto and MemoryRecords.filterTo, whose rules this follows).

Records of a v2 batch (layout in `odradek.records.batch`): length varint, attributes int8,
timestamp_delta varlong, offset_delta varint, key_length varint, key, value_length varint (-1: a
tombstone), value, headers. `scan_records` reads only up to the value length; headers are skipped by
the record's length.

The offset map holds, for each key of the dirty section, the offset of its last record. A key shorter
than 16 bytes is its own map key, a longer one its 16-byte BLAKE2b digest (the lengths differ, so the
two kinds never collide; Kafka uses an MD5 digest for every key). Its memory is bounded: each new
entry is charged `ENTRY_OVERHEAD_BYTES` plus its key's length against the budget
(`log.cleaner.dedupe.buffer.size` / threads x `log.cleaner.io.buffer.load.factor`), and the map
refuses new keys once the budget is spent; only the first batch of a pass is always taken whole, so a
pass always makes progress. `latest_offset` is the last offset of the last batch mapped in full.

A record at or below the map's latest offset is kept when no later record of its key is in the map
and it is not an expired tombstone; one above the latest offset is always kept; a keyless record is
removed (compacted topics refuse them on produce; Kafka's cleaner drops any it finds). A batch whose
records are all kept, and which needs no delete horizon, is copied byte for byte. Otherwise the kept
records are written into a batch with the original base offset, last offset delta, producer id, epoch,
base sequence, leader epoch, timestamp type and compression (records recompressed with the same
codec). The base timestamp stays the original one (so the kept records' bytes are copied unchanged),
except that a batch keeping tombstones gets a delete horizon (KIP-534): attribute bit 6 set and the
base timestamp set to now + `delete.retention.ms`, with every record's timestamp delta re-encoded so
its timestamp is unchanged; its tombstones go at the first cleaning after that time. The max timestamp
of a CreateTime batch is recomputed from the kept records. A batch left without records is dropped,
except (RETAIN_EMPTY, as Kafka) the last data batch of a producer still in the producer state, and
the batch that ends at the round's upper bound: those become an empty batch (header only, count 0, no
compression, base timestamp -1, the original max timestamp).

Transactions: control batches are kept as they are, and no batch is treated as aborted data, through
`TransactionFilter` (`RETAIN_ALL`, made by `CleanPlan.new_txn_filter`). When transactions come, a
filter that reads the transaction index (aborted data is neither mapped nor kept; a marker goes once
its transaction's data is gone and its delete horizon has passed, Kafka's CleanedTransactionMetadata)
plugs in there: the batch-retention rules above already ask it about every batch.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Protocol

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.crc import crc32c
from odradek.records.header import ATTRIBUTES_OFFSET, COMPRESSION_MASK, CONTROL_MASK, \
    DELETE_HORIZON_MASK, HEADER_SIZE, LOG_OVERHEAD, TIMESTAMP_TYPE_MASK, TRANSACTIONAL_MASK
from odradek.records.varint import encode_varint, encode_varlong

ENTRY_OVERHEAD_BYTES = 104  # a dict slot, the key object's header and the offset's int object
SHORT_KEY_BYTES = 16
NO_TIMESTAMP = -1

# base_offset, batch_length, partition_leader_epoch, magic, crc, attributes, last_offset_delta,
# base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, records_count
HEADER = struct.Struct(">qiiBIhiqqqhii")


class MalformedRecords(Exception):
    """Records that do not parse: the batch is kept as it is and its keys are not mapped."""


# ---- the map ---------------------------------------------------------------------------------------

def map_key(key: bytes) -> bytes:
    return key if len(key) < SHORT_KEY_BYTES else hashlib.blake2b(key, digest_size=16).digest()


class OffsetMap:
    """Key -> offset of its last record in the mapped range, within `memory_bytes`."""

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self.offsets: dict[bytes, int] = {}
        self.used_bytes = 0
        self.latest_offset = -1

    def clear(self, latest_offset: int = -1) -> None:
        self.offsets = {}
        self.used_bytes = 0
        self.latest_offset = latest_offset

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def utilization(self) -> float:
        return self.used_bytes / self.memory_bytes

    def put(self, key: bytes, offset: int, force: bool = False) -> bool:
        """Map `key` (already `map_key`ed) to `offset`; False, and nothing changed, when full."""
        offsets = self.offsets
        if key not in offsets:
            cost = ENTRY_OVERHEAD_BYTES + len(key)
            if self.used_bytes + cost > self.memory_bytes and not force:
                return False
            self.used_bytes += cost
        offsets[key] = offset
        return True

    def get(self, key: bytes) -> int:
        return self.offsets.get(key, -1)


# ---- records ---------------------------------------------------------------------------------------

def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint of more than one byte at pos: (value, next position)."""
    raw = shift = 0
    while True:
        b = data[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise MalformedRecords("varint longer than 10 bytes")


def scan_records(data: bytes, count: int) -> list[tuple[int, int, int, int, bytes | None, bool]]:
    """(start, end, timestamp_delta, offset_delta, key, has_value) for each of `count` records, which
    must fill `data` exactly. One- and two-byte varints are decoded inline: this loop is the
    cleaner's cost (a call per field would double it)."""
    out: list[tuple[int, int, int, int, bytes | None, bool]] = []
    append = out.append
    pos, end = 0, len(data)
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                length, p = (b >> 1) ^ -(b & 1), pos + 1
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                length, p = (raw >> 1) ^ -(raw & 1), pos + 2
            else:
                length, p = _zigzag(data, pos)
            record_end = p + length
            if length < 6 or record_end > end:
                raise MalformedRecords(f"record length {length} at {pos}")
            p += 1  # attributes
            b = data[p]
            if b < 0x80:
                ts_delta, p = (b >> 1) ^ -(b & 1), p + 1
            elif data[p + 1] < 0x80:
                raw = (b & 0x7F) | (data[p + 1] << 7)
                ts_delta, p = (raw >> 1) ^ -(raw & 1), p + 2
            else:
                ts_delta, p = _zigzag(data, p)
            b = data[p]
            if b < 0x80:
                offset_delta, p = (b >> 1) ^ -(b & 1), p + 1
            elif data[p + 1] < 0x80:
                raw = (b & 0x7F) | (data[p + 1] << 7)
                offset_delta, p = (raw >> 1) ^ -(raw & 1), p + 2
            else:
                offset_delta, p = _zigzag(data, p)
            b = data[p]
            if b < 0x80:
                key_length, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                key_length, p = _zigzag(data, p)
            if key_length >= 0:
                key = data[p:p + key_length]
                p += key_length
            else:
                key = None
            if p >= record_end or key_length < -1:
                raise MalformedRecords(f"record fields past its end at {pos}")
            append((pos, record_end, ts_delta, offset_delta, key, data[p] != 1))  # 0x01: null value
            pos = record_end
    except IndexError:
        raise MalformedRecords("records truncated") from None
    if pos != end:
        raise MalformedRecords(f"{end - pos} bytes after the last record")
    return out


def batch_records(batch: bytes, attributes: int, count: int) -> tuple[bytes, list]:
    """The batch's records section (decompressed) and its scanned records."""
    body = _records_section(batch, attributes)
    return body, scan_records(body, count)


def _records_section(batch: bytes, attributes: int) -> bytes:
    body = batch[HEADER_SIZE:]
    codec = attributes & COMPRESSION_MASK
    if codec:
        try:
            body = bytes(codecs.decompress(codec, body))
        except ProtocolError as e:
            raise MalformedRecords(str(e)) from None
    return body


# The two loops below are `scan_records` fused with what each phase does with a record: building a
# tuple per record for a separate loop cost about 45% more (a tuple, an append, an unpack).

def _map_records(data: bytes, count: int, base: int, start_offset: int, offset_map: OffsetMap,
                 force: bool) -> bool:
    """Map the keyed records at or after `start_offset`; True (and stop) when the map is full."""
    offsets, budget, used = offset_map.offsets, offset_map.memory_bytes, offset_map.used_bytes
    pos, end = 0, len(data)
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                record_end, p = pos + 1 + ((b >> 1) ^ -(b & 1)), pos + 2
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                record_end, p = pos + 2 + ((raw >> 1) ^ -(raw & 1)), pos + 3
            else:
                length, p = _zigzag(data, pos)
                record_end, p = p + length, p + 1
            while data[p] >= 0x80:  # the timestamp delta, not needed here
                p += 1
            b = data[p + 1]
            if b < 0x80:
                offset_delta, p = (b >> 1) ^ -(b & 1), p + 2
            elif data[p + 2] < 0x80:
                raw = (b & 0x7F) | (data[p + 2] << 7)
                offset_delta, p = (raw >> 1) ^ -(raw & 1), p + 3
            else:
                offset_delta, p = _zigzag(data, p + 1)
            b = data[p]
            if b < 0x80:
                key_length, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                key_length, p = _zigzag(data, p)
            if p + key_length >= record_end or record_end > end or key_length < -1:
                raise MalformedRecords(f"record at {pos} runs past its length")
            pos = record_end
            if key_length < 0 or base + offset_delta < start_offset:
                continue
            key = data[p:p + key_length]
            if key_length >= SHORT_KEY_BYTES:
                key = map_key(key)
            if key not in offsets:  # OffsetMap.put, inlined
                cost = ENTRY_OVERHEAD_BYTES + len(key)
                if used + cost > budget and not force:
                    offset_map.used_bytes = used
                    return True
                used += cost
            offsets[key] = base + offset_delta
    except IndexError:
        raise MalformedRecords("records truncated") from None
    finally:
        offset_map.used_bytes = used
    if pos != end:
        raise MalformedRecords(f"{end - pos} bytes after the last record")
    return False


def _filter_records(data: bytes, count: int, base: int, offset_map: OffsetMap, expired: bool,
                    ctx: FilterContext) -> tuple[list[tuple[int, int, int]], bool]:
    """(start, end, timestamp delta) of the records to keep, and whether a tombstone is kept."""
    latest, get = offset_map.latest_offset, offset_map.offsets.get
    kept: list[tuple[int, int, int]] = []
    tombstones = False
    pos, end = 0, len(data)
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                record_end, p = pos + 1 + ((b >> 1) ^ -(b & 1)), pos + 2
            elif data[pos + 1] < 0x80:
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                record_end, p = pos + 2 + ((raw >> 1) ^ -(raw & 1)), pos + 3
            else:
                length, p = _zigzag(data, pos)
                record_end, p = p + length, p + 1
            b = data[p]
            if b < 0x80:
                ts_delta, p = (b >> 1) ^ -(b & 1), p + 1
            elif data[p + 1] < 0x80:
                raw = (b & 0x7F) | (data[p + 1] << 7)
                ts_delta, p = (raw >> 1) ^ -(raw & 1), p + 2
            else:
                ts_delta, p = _zigzag(data, p)
            b = data[p]
            if b < 0x80:
                offset_delta, p = (b >> 1) ^ -(b & 1), p + 1
            elif data[p + 1] < 0x80:
                raw = (b & 0x7F) | (data[p + 1] << 7)
                offset_delta, p = (raw >> 1) ^ -(raw & 1), p + 2
            else:
                offset_delta, p = _zigzag(data, p)
            b = data[p]
            if b < 0x80:
                key_length, p = (b >> 1) ^ -(b & 1), p + 1
            else:
                key_length, p = _zigzag(data, p)
            value_at = p + key_length if key_length > 0 else p
            if value_at >= record_end or record_end > end or key_length < -1:
                raise MalformedRecords(f"record at {pos} runs past its length")
            has_value = data[value_at] != 1  # 0x01 is the value length -1
            offset = base + offset_delta
            if offset > latest:
                keep = True
            elif key_length < 0:
                keep = False
                ctx.keyless_removed += 1
            else:
                key = data[p:p + key_length]
                if key_length >= SHORT_KEY_BYTES:
                    key = map_key(key)
                keep = offset >= get(key, -1) and (has_value or not expired)
            if keep:
                kept.append((pos, record_end, ts_delta))
                tombstones = tombstones or not has_value
            pos = record_end
    except IndexError:
        raise MalformedRecords("records truncated") from None
    if pos != end:
        raise MalformedRecords(f"{end - pos} bytes after the last record")
    return kept, tombstones


# ---- transactions (the hook) -----------------------------------------------------------------------

class TransactionFilter(Protocol):
    """What the cleaner asks about transactions, batch by batch in offset order."""

    def discard_data_batch(self, producer_id: int, last_offset: int, transactional: bool) -> bool:
        """True for a batch of aborted transactional data (neither mapped nor kept)."""

    def discard_control_batch(self, batch: bytes) -> bool:
        """True for a marker whose transaction's data is all gone (removed at its delete horizon)."""


class _RetainAll:
    def discard_data_batch(self, producer_id: int, last_offset: int, transactional: bool) -> bool:
        return False

    def discard_control_batch(self, batch: bytes) -> bool:
        return False


RETAIN_ALL: TransactionFilter = _RetainAll()


# ---- mapping a batch -------------------------------------------------------------------------------

def map_batch(batch: bytes, offset_map: OffsetMap, start_offset: int, force: bool,
              txn: TransactionFilter = RETAIN_ALL) -> tuple[bool, int]:
    """Put the batch's keyed records at or after `start_offset` in the map: (full, records read).
    When the map fills mid-batch, the latest offset stays at the previous batch's end."""
    (base, _len, _epoch, _magic, _crc, attributes, last_delta, _bts, _mts, pid, _pe, _seq,
     count) = HEADER.unpack_from(batch, 0)
    last = base + last_delta
    if attributes & CONTROL_MASK or txn.discard_data_batch(pid, last, bool(attributes & TRANSACTIONAL_MASK)):
        offset_map.latest_offset = max(offset_map.latest_offset, last)
        return False, 1 if attributes & CONTROL_MASK else count
    try:
        body = _records_section(batch, attributes)
        full = _map_records(body, count, base, start_offset, offset_map, force)
    except MalformedRecords:
        full = False  # kept as it is when recopied; its keys stay unmapped (less is removed)
    if full:
        return True, count
    if last >= start_offset:
        offset_map.latest_offset = max(offset_map.latest_offset, last)
    return False, count


# ---- filtering a batch -----------------------------------------------------------------------------

@dataclass(slots=True)
class FilterContext:
    offset_map: OffsetMap
    now_ms: int
    delete_retention_ms: int
    producers: dict[int, tuple[int, int]]  # producer id -> (last data offset or -1, epoch)
    upper_bound_offset: int                 # the round's first uncleanable offset
    txn: TransactionFilter = RETAIN_ALL
    records_read: int = 0
    records_kept: int = 0
    keyless_removed: int = 0
    malformed_batches: int = 0
    earliest_horizon_ms: int | None = None  # of the tombstones kept with a horizon


def filter_batch(batch: bytes, ctx: FilterContext) -> bytes | None:
    """The batch as it is to be written to the cleaned segment, or None to drop it."""
    (base, _len, epoch, _magic, _crc, attributes, last_delta, base_ts, max_ts, pid, p_epoch, seq,
     count) = HEADER.unpack_from(batch, 0)
    last = base + last_delta
    control = bool(attributes & CONTROL_MASK)
    discard = ctx.txn.discard_control_batch(batch) if control else \
        ctx.txn.discard_data_batch(pid, last, bool(attributes & TRANSACTIONAL_MASK))
    retain_empty = (pid >= 0 and _last_batch_of_producer(ctx.producers.get(pid), last, control,
                                                         p_epoch)) \
        or last + 1 == ctx.upper_bound_offset
    if discard:
        return _empty_batch(batch) if retain_empty else None
    if control:
        ctx.records_read += 1
        ctx.records_kept += 1
        return batch
    horizon = base_ts if attributes & DELETE_HORIZON_MASK else None
    try:
        body = _records_section(batch, attributes)
        kept, tombstones = _filter_records(body, count, base, ctx.offset_map,
                                           horizon is not None and ctx.now_ms >= horizon, ctx)
    except MalformedRecords:
        ctx.malformed_batches += 1
        return batch
    ctx.records_read += count
    ctx.records_kept += len(kept)
    if not kept:
        return _empty_batch(batch) if retain_empty else None
    if tombstones:
        if horizon is None:
            horizon = ctx.now_ms + ctx.delete_retention_ms
        if ctx.earliest_horizon_ms is None or horizon < ctx.earliest_horizon_ms:
            ctx.earliest_horizon_ms = horizon
    if len(kept) == count and (horizon is None or attributes & DELETE_HORIZON_MASK):
        return batch
    return _rebuild(batch, body, kept, horizon)


def _last_batch_of_producer(last_record: tuple[int, int] | None, last_offset: int, control: bool,
                            epoch: int) -> bool:
    if last_record is None:
        return False
    last_data_offset, producer_epoch = last_record
    if last_data_offset >= 0:
        return last_offset == last_data_offset
    return control and epoch == producer_epoch


def _rebuild(batch: bytes, body: bytes, kept: list, horizon: int | None) -> bytes:
    (base, _len, epoch, _magic, _crc, attributes, last_delta, base_ts, max_ts, pid, p_epoch, seq,
     _count) = HEADER.unpack_from(batch, 0)
    log_append_time = bool(attributes & TIMESTAMP_TYPE_MASK)
    if not log_append_time:
        max_ts = base_ts + max(r[2] for r in kept)
    if horizon is not None and not attributes & DELETE_HORIZON_MASK:
        # The base timestamp becomes the horizon: each record's delta moves so that its timestamp
        # (base + delta) stays what it was.
        shift = base_ts - horizon
        parts = [_with_timestamp_delta(body, r, r[2] + shift) for r in kept]
        attributes |= DELETE_HORIZON_MASK
        base_ts = horizon
    else:
        parts = [body[r[0]:r[1]] for r in kept]
    records = b"".join(parts)
    codec = attributes & COMPRESSION_MASK
    if codec:
        records = codecs.compress(codec, records)
    header = bytearray(HEADER.pack(base, HEADER_SIZE + len(records) - LOG_OVERHEAD, epoch, 2, 0,
                                   attributes, last_delta, base_ts, max_ts, pid, p_epoch, seq,
                                   len(kept)))
    crc = crc32c(records, crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + records


def _with_timestamp_delta(body: bytes, record: tuple, delta: int) -> bytes:
    start, end = record[0], record[1]
    b = body[start]
    p = start + 1 if b < 0x80 else _zigzag(body, start)[1]
    after_attributes = p + 1
    b = body[after_attributes]
    rest = after_attributes + 1 if b < 0x80 else _zigzag(body, after_attributes)[1]
    inner = body[p:after_attributes] + encode_varlong(delta) + body[rest:end]
    return encode_varint(len(inner)) + inner


def _empty_batch(batch: bytes) -> bytes:
    """Header only: the batch's offsets and producer fields, no records (Kafka's writeEmptyHeader)."""
    (base, _len, epoch, _magic, _crc, attributes, last_delta, _base_ts, max_ts, pid, p_epoch, seq,
     _count) = HEADER.unpack_from(batch, 0)
    attributes &= TIMESTAMP_TYPE_MASK | TRANSACTIONAL_MASK | CONTROL_MASK
    header = bytearray(HEADER.pack(base, HEADER_SIZE - LOG_OVERHEAD, epoch, 2, 0, attributes,
                                   last_delta, NO_TIMESTAMP, max_ts, pid, p_epoch, seq, 0))
    struct.pack_into(">I", header, 17, crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    return bytes(header)
