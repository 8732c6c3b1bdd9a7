"""The records of `__consumer_offsets`: which partition holds a group, and the keys and values written
there, in Apache Kafka's formats so that tools decoding that topic read ours (seed 001, "For each
consumer group, the coordinator stores the following information"; seed 004, "Offset Commit/Fetch API").

Partition of a group: `abs(hash(group_id)) % partitions`, with Java's `String.hashCode` over UTF-16
code units and Kafka's `Utils.abs` (which maps Integer.MIN_VALUE to 0, not to itself).

Key and value layouts (each starts with an int16 version, see `odradek.protocol.api.encode_record`):

    key version 0 or 1   OffsetCommitKey    group, topic, partition      -> OffsetCommitValue
    key version 2        GroupMetadataKey   group                        -> GroupMetadataValue
    key version 3-8      the consumer group protocol's records (see `consumer_records`)
    other versions       later record types (share groups, resolved regexes), skipped here

We write OffsetCommitKey v1 with OffsetCommitValue v3 (v1 when the commit carries an explicit expire
timestamp, as Kafka does), and GroupMetadataKey v2 with GroupMetadataValue v3. A null value is a
tombstone: the offset, or the group's metadata, is gone. Every operation's records go out as one v2
batch (CreateTime, no producer id), appended like any produce.

Transactional offset commits (TxnOffsetCommit; KIP-98, KIP-447) are the same OffsetCommit records in
a transactional batch carrying the producer's id and epoch (`TxnOffsetRecord`); they stay pending
until the transaction coordinator writes the producer's COMMIT marker to the partition, and are
dropped at its ABORT marker (`TxnMarkerRecord`, what a control batch reads as).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Union

from odradek.coordinator import consumer_records
from odradek.coordinator.consumer_records import CONSUMER_RECORD_TYPES, ConsumerRecord
from odradek.protocol.api import decode_record, encode_record
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages.group_metadata_value import GroupMetadataValue, MemberMetadata
from odradek.protocol.messages.group_metadata_key import GroupMetadataKey
from odradek.protocol.messages.offset_commit_key import OffsetCommitKey
from odradek.protocol.messages.offset_commit_value import OffsetCommitValue
from odradek.records import RecordBatch, RecordBatchBuilder, iter_headers
from odradek.records.header import BatchHeader
from odradek.records.control import EndTransactionMarker

log = logging.getLogger("odradek.coordinator")

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3
OFFSET_VALUE_VERSION_WITH_EXPIRY = 1
GROUP_VALUE_VERSION = 3

__all__ = [
    "GroupMetadataValue", "MemberMetadata", "OFFSETS_TOPIC", "GroupRecord", "OffsetAndMetadata",
    "OffsetRecord", "Record", "TxnMarkerRecord", "TxnOffsetRecord", "build_batch", "decode", "encode", "iter_batches", "java_string_hash", "partition_for",
]


def java_string_hash(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as an int32."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's `Utils.abs(key.hashCode) % partitions` (Utils.abs(MIN_VALUE) is 0)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int                  # -1: unknown
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int | None    # only from v1 commits with a retention time

    def to_value(self) -> tuple[int, OffsetCommitValue]:
        value = OffsetCommitValue(offset=self.offset, leader_epoch=self.leader_epoch, metadata=self.metadata,
                                  commit_timestamp=self.commit_timestamp_ms,
                                  expire_timestamp=self.expire_timestamp_ms if self.expire_timestamp_ms
                                  is not None else -1)
        return (OFFSET_VALUE_VERSION_WITH_EXPIRY if self.expire_timestamp_ms is not None
                else OFFSET_VALUE_VERSION), value

    @classmethod
    def from_value(cls, version: int, v: OffsetCommitValue) -> OffsetAndMetadata:
        expire = v.expire_timestamp if version == 1 and v.expire_timestamp >= 0 else None
        return cls(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, expire)


@dataclass(frozen=True, slots=True)
class OffsetRecord:
    group_id: str
    topic: str
    partition: int
    value: OffsetAndMetadata | None    # None: tombstone


@dataclass(frozen=True, slots=True)
class GroupRecord:
    group_id: str
    value: GroupMetadataValue | None   # None: tombstone


@dataclass(frozen=True, slots=True)
class TxnOffsetRecord:
    """An offset commit of a producer's open transaction."""
    producer_id: int
    producer_epoch: int
    record: OffsetRecord


@dataclass(frozen=True, slots=True)
class TxnMarkerRecord:
    """A transaction marker: the producer's pending offset commits are committed or dropped."""
    producer_id: int
    commit: bool


Record = Union[OffsetRecord, GroupRecord, ConsumerRecord, TxnOffsetRecord, TxnMarkerRecord]


def encode(record: Record) -> tuple[bytes, bytes | None]:
    if isinstance(record, CONSUMER_RECORD_TYPES):
        return consumer_records.encode(record)
    if isinstance(record, TxnOffsetRecord):
        record = record.record
    assert not isinstance(record, TxnMarkerRecord), "markers are written by the transaction coordinator"
    if isinstance(record, OffsetRecord):
        key = encode_record("OffsetCommitKey", OFFSET_KEY_VERSION,
                            OffsetCommitKey(group=record.group_id, topic=record.topic,
                                            partition=record.partition))
        if record.value is None:
            return key, None
        version, value = record.value.to_value()
        return key, encode_record("OffsetCommitValue", version, value)
    assert isinstance(record, GroupRecord)
    key = encode_record("GroupMetadataKey", GROUP_KEY_VERSION, GroupMetadataKey(group=record.group_id))
    if record.value is None:
        return key, None
    return key, encode_record("GroupMetadataValue", GROUP_VALUE_VERSION, record.value)


def decode(key: bytes | None, value: bytes | None) -> Record | None:
    """The record, or None for record types this coordinator does not read (KIP-848, share groups).
    Raises ProtocolError for a key or value it should read but cannot."""
    if key is None or len(key) < 2:
        raise ProtocolError("__consumer_offsets record without a key")
    key_version = int.from_bytes(key[:2], "big", signed=True)
    if key_version in (0, 1):
        _, k = decode_record("OffsetCommitKey", key)
        assert isinstance(k, OffsetCommitKey)
        if value is None:
            return OffsetRecord(k.group, k.topic, k.partition, None)
        version, v = decode_record("OffsetCommitValue", value)
        assert isinstance(v, OffsetCommitValue)
        return OffsetRecord(k.group, k.topic, k.partition, OffsetAndMetadata.from_value(version, v))
    if key_version == GROUP_KEY_VERSION:
        _, gk = decode_record("GroupMetadataKey", key)
        assert isinstance(gk, GroupMetadataKey)
        if value is None:
            return GroupRecord(gk.group, None)
        _, gv = decode_record("GroupMetadataValue", value)
        assert isinstance(gv, GroupMetadataValue)
        return GroupRecord(gk.group, gv)
    if key_version in consumer_records.KEY_VERSIONS:
        return consumer_records.decode(key_version, key, value)
    return None


def build_batch(records: list[Record], now_ms: int) -> bytes:
    """One uncompressed v2 batch holding `records` in order (offsets are assigned by the log); a
    transactional batch of the producer when they are transactional offset commits (all of them)."""
    first = records[0] if records else None
    if isinstance(first, TxnOffsetRecord):
        assert all(isinstance(r, TxnOffsetRecord) and r.producer_id == first.producer_id for r in records)
        # Sequence numbers are not checked for a coordinator's appends; 0 keeps the batch well formed.
        builder = RecordBatchBuilder(producer_id=first.producer_id, producer_epoch=first.producer_epoch,
                                     base_sequence=0, is_transactional=True)
    else:
        builder = RecordBatchBuilder()
    for r in records:
        key, value = encode(r)
        builder.append(key, value, timestamp=now_ms)
    return builder.build()


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, list[Record]]]:
    """(next offset, records this coordinator reads) for each whole v2 batch in `buf`, as the log
    returns them; control batches (transaction markers) and unknown record types give no records."""
    for h in iter_headers(buf, allow_partial_tail=True):
        out: list[Record] = []
        if h.is_control:
            marker = _marker(buf, h)
            if marker is not None:
                out.append(marker)
        else:
            for r in RecordBatch(buf, h.pos).records():
                try:
                    rec = decode(r.key, r.value)
                except ProtocolError as e:
                    log.warning("skipping unreadable %s record at offset %d: %s", OFFSETS_TOPIC, r.offset, e)
                    continue
                if isinstance(rec, OffsetRecord) and h.is_transactional:
                    out.append(TxnOffsetRecord(h.producer_id, h.producer_epoch, rec))
                elif rec is not None:
                    out.append(rec)
        yield h.next_offset, out


def _marker(buf: bytes | bytearray | memoryview, h: BatchHeader) -> TxnMarkerRecord | None:
    for r in RecordBatch(buf, h.pos).records():
        try:
            return TxnMarkerRecord(h.producer_id, EndTransactionMarker.decode(r.key, r.value).is_commit)
        except ProtocolError as e:
            log.warning("skipping unreadable control record at offset %d: %s", r.offset, e)
    return None
