"""The records of `__transaction_state`: which partition holds a transactional id, and the key and
value written there, in Apache Kafka's formats so that tools decoding that topic read ours (seed 003,
"Message Delivery Semantics"; KIP-98; Kafka's TransactionLog).

Partition of a transactional id: `Utils.abs(transactional_id.hashCode) % partitions`, the same
function as for groups (`records.partition_for`).

    key    int16 version 0, TransactionLogKey    transactional_id
    value  int16 version 0, TransactionLogValue  producer_id, producer_epoch, transaction_timeout_ms,
           transaction_status (int8, `TxnState` ids), transaction_partitions (topic, [partition]),
           transaction_last_update_timestamp_ms, transaction_start_timestamp_ms
           (version 1, flexible, adds the tagged previous/next producer ids and the client's
           transaction version of KIP-890 part 2; both are read; version 1 is written for a
           transaction of the protocol v2 or one that names another producer id, version 0 otherwise)

A null value is a tombstone: the transactional id has expired. Every operation's records go out as
one uncompressed v2 batch without a producer id; the topic is compacted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from odradek.coordinator.records import partition_for
from odradek.protocol.api import decode_record, encode_record
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages.transaction_log_key import TransactionLogKey
from odradek.protocol.messages.transaction_log_value import PartitionsSchema, TransactionLogValue
from odradek.records import RecordBatch, RecordBatchBuilder, iter_headers

log = logging.getLogger("odradek.transactions")

TRANSACTION_STATE_TOPIC = "__transaction_state"
KEY_VERSION = 0
VALUE_VERSION = 0
VALUE_VERSION_FLEXIBLE = 1

__all__ = ["TRANSACTION_STATE_TOPIC", "TxnRecord", "TxnValue", "build_batch", "decode", "encode",
           "iter_batches", "partition_for"]


@dataclass(frozen=True, slots=True)
class TxnValue:
    """The durable part of a transactional id's metadata."""
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: int                                  # TxnState id
    partitions: frozenset[tuple[str, int]]
    last_update_ms: int
    start_ms: int
    # Not written (version 0 has no field for it; Kafka's loader forgets it too): the epoch before the
    # last bump, so a KIP-360 producer retrying InitProducerId gets the same answer again.
    last_producer_epoch: int = -1
    previous_producer_id: int = -1               # version 1 (tagged): the id before a switch
    next_producer_id: int = -1                   # version 1 (tagged): the id the end switches to
    client_transaction_version: int = 0          # version 1 (tagged): the client's transaction.version

    @property
    def version(self) -> int:
        flexible = self.client_transaction_version > 0 or self.previous_producer_id >= 0 \
            or self.next_producer_id >= 0
        return VALUE_VERSION_FLEXIBLE if flexible else VALUE_VERSION


@dataclass(frozen=True, slots=True)
class TxnRecord:
    transactional_id: str
    value: TxnValue | None                      # None: tombstone


def encode(record: TxnRecord) -> tuple[bytes, bytes | None]:
    key = encode_record("TransactionLogKey", KEY_VERSION, TransactionLogKey(transactional_id=record.transactional_id))
    v = record.value
    if v is None:
        return key, None
    by_topic: dict[str, list[int]] = {}
    for topic, p in sorted(v.partitions):
        by_topic.setdefault(topic, []).append(p)
    value = TransactionLogValue(
        producer_id=v.producer_id, producer_epoch=v.producer_epoch, transaction_timeout_ms=v.timeout_ms,
        transaction_status=v.state,
        transaction_partitions=[PartitionsSchema(topic=t, partition_ids=ps) for t, ps in by_topic.items()],
        transaction_last_update_timestamp_ms=v.last_update_ms, transaction_start_timestamp_ms=v.start_ms,
        previous_producer_id=v.previous_producer_id, next_producer_id=v.next_producer_id,
        client_transaction_version=v.client_transaction_version)
    return key, encode_record("TransactionLogValue", v.version, value)


def decode(key: bytes | None, value: bytes | None) -> TxnRecord | None:
    """The record, or None for a key version this coordinator does not read. Raises ProtocolError."""
    if key is None or len(key) < 2:
        raise ProtocolError(f"{TRANSACTION_STATE_TOPIC} record without a key")
    if int.from_bytes(key[:2], "big", signed=True) != KEY_VERSION:
        return None
    _, k = decode_record("TransactionLogKey", key)
    assert isinstance(k, TransactionLogKey)
    if value is None:
        return TxnRecord(k.transactional_id, None)
    _, v = decode_record("TransactionLogValue", value)
    assert isinstance(v, TransactionLogValue)
    partitions = frozenset((t.topic, p) for t in (v.transaction_partitions or []) for p in t.partition_ids)
    return TxnRecord(k.transactional_id, TxnValue(
        v.producer_id, v.producer_epoch, v.transaction_timeout_ms, v.transaction_status, partitions,
        v.transaction_last_update_timestamp_ms, v.transaction_start_timestamp_ms,
        previous_producer_id=v.previous_producer_id, next_producer_id=v.next_producer_id,
        client_transaction_version=v.client_transaction_version or 0))


def build_batch(records: list[TxnRecord], now_ms: int) -> bytes:
    builder = RecordBatchBuilder()
    for r in records:
        key, value = encode(r)
        builder.append(key, value, timestamp=now_ms)
    return builder.build()


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[tuple[int, list[TxnRecord]]]:
    """(next offset, records) for each whole v2 batch in `buf`."""
    for h in iter_headers(buf, allow_partial_tail=True):
        out: list[TxnRecord] = []
        if not h.is_control:
            for r in RecordBatch(buf, h.pos).records():
                try:
                    rec = decode(r.key, r.value)
                except ProtocolError as e:
                    log.warning("skipping unreadable %s record at offset %d: %s", TRANSACTION_STATE_TOPIC,
                                r.offset, e)
                    continue
                if rec is not None:
                    out.append(rec)
        yield h.next_offset, out
