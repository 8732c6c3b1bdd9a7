"""Control records: the transaction markers of control batches (attributes bit 5).

A control batch (seed 004, "Record Batch Attributes": brokers write them, clients never hand them to
applications) holds one record whose key and value are, big-endian, as Kafka writes them:

    key    version int16 (0), type int16     0 ABORT, 1 COMMIT (Kafka also defines 2 LEADER_CHANGE
                                             and 3-6 for KRaft snapshots and voters)
    value  version int16 (0), coordinator_epoch int32      (transaction markers only)

Readers accept a higher version and read the fields they know, as Kafka does; a key or value too short
for those fields, or with a negative version, is a ProtocolError. A marker batch is transactional and
control, carries the producer id and epoch, base sequence -1, and one record at offset delta 0.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from odradek.protocol.exceptions import ProtocolError
from odradek.records import codecs
from odradek.records.builder import RecordBatchBuilder
from odradek.records.header import NO_PARTITION_LEADER_EPOCH

ABORT = 0
COMMIT = 1
LEADER_CHANGE = 2
CONTROL_RECORD_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0

_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


def encode_control_key(control_type: int, version: int = CONTROL_RECORD_KEY_VERSION) -> bytes:
    return _KEY.pack(version, control_type)


def parse_control_key(key) -> tuple[int, int]:
    """(version, type) of a control record key."""
    if key is None or len(key) < _KEY.size:
        raise ProtocolError("control record key shorter than 4 bytes")
    version, control_type = _KEY.unpack_from(key, 0)
    if version < 0:
        raise ProtocolError(f"control record key version {version} is negative")
    return version, control_type


@dataclass(frozen=True)
class EndTransactionMarker:
    """A COMMIT or ABORT marker and the transaction coordinator epoch that wrote it."""

    control_type: int
    coordinator_epoch: int

    @property
    def is_commit(self) -> bool:
        return self.control_type == COMMIT

    def key(self) -> bytes:
        return encode_control_key(self.control_type)

    def value(self) -> bytes:
        return _VALUE.pack(END_TXN_MARKER_VERSION, self.coordinator_epoch)

    @classmethod
    def decode(cls, key, value) -> "EndTransactionMarker":
        _, control_type = parse_control_key(key)
        if control_type not in (ABORT, COMMIT):
            raise ProtocolError(f"control record type {control_type} is not a transaction marker")
        if value is None or len(value) < _VALUE.size:
            raise ProtocolError("end transaction marker value shorter than 6 bytes")
        version, coordinator_epoch = _VALUE.unpack_from(value, 0)
        if version < 0:
            raise ProtocolError(f"end transaction marker version {version} is negative")
        return cls(control_type, coordinator_epoch)


def build_end_txn_marker_batch(marker: EndTransactionMarker, *, producer_id: int, producer_epoch: int,
                               timestamp: int, base_offset: int = 0,
                               partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> bytes:
    """A control batch holding one transaction marker."""
    builder = RecordBatchBuilder(
        compression=codecs.NONE, base_offset=base_offset, producer_id=producer_id,
        producer_epoch=producer_epoch, is_transactional=True, is_control=True,
        partition_leader_epoch=partition_leader_epoch)
    builder.append(marker.key(), marker.value(), timestamp=timestamp)
    return builder.build()
