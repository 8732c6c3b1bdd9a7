"""Varints, the header view's patches, control batches, record-set iteration and builder misuse."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.record import util as kp_util
from kafka.record.default_records import DefaultRecordBatch

from odradek.protocol.exceptions import ProtocolError
from odradek.records import (
    ABORT, COMMIT, EndTransactionMarker, LegacyBuilder, RecordBatch, RecordBatchBuilder,
    build_end_txn_marker_batch, ensure_valid, iter_batches, iter_headers, iter_records, v2_to_legacy,
)
from odradek.records.control import parse_control_key
from odradek.records.header import (
    peek_magic, peek_offset_and_length, set_base_offset, set_partition_leader_epoch,
)
from odradek.records.varint import (
    encode_varint, encode_varlong, read_varint, read_varlong, size_of_varint,
)

KNOWN_VARINTS = [(0, "00"), (-1, "01"), (1, "02"), (63, "7e"), (-64, "7f"), (64, "8001"),
                 (2**31 - 1, "feffffff0f"), (-(2**31), "ffffffff0f")]


@pytest.mark.parametrize("value,encoded", KNOWN_VARINTS)
def test_known_varints(value, encoded):
    data = bytes.fromhex(encoded)
    assert encode_varint(value) == data
    assert read_varint(data, 0, len(data)) == (value, len(data))


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_varint_matches_kafka_python(value):
    theirs = bytearray()
    kp_util.encode_varint(value, theirs.append)
    assert encode_varint(value) == bytes(theirs)
    assert size_of_varint(value) == kp_util.size_of_varint(value)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varlong_round_trip(value):
    data = encode_varlong(value) + b"tail"
    assert read_varlong(data, 0, len(data)) == (value, len(data) - 4)
    assert len(data) - 4 <= 10


def _batch(**kwargs):
    builder = RecordBatchBuilder(**kwargs)
    builder.append(b"k", b"v", timestamp=10)
    builder.append(b"k2", b"v2", timestamp=11)
    return builder.build()


def test_offset_and_leader_epoch_patches_keep_the_crc():
    data = bytearray(_batch(compression=1))
    set_base_offset(data, 0, 1_000_000)
    set_partition_leader_epoch(data, 0, 9)
    batch = RecordBatch(data)
    batch.ensure_valid()
    assert (batch.base_offset, batch.partition_leader_epoch, batch.last_offset) == (1_000_000, 9, 1_000_001)
    assert [r.offset for r in batch] == [1_000_000, 1_000_001]


def test_peeks_raise_protocol_error_when_short():
    with pytest.raises(ProtocolError):
        peek_offset_and_length(b"\x00" * 11)
    with pytest.raises(ProtocolError):
        peek_magic(b"\x00" * 16)
    data = _batch()
    assert peek_offset_and_length(data) == (0, len(data) - 12)
    assert peek_magic(data) == 2


def test_iter_headers_partial_tail():
    data = _batch() + _batch()
    assert len(list(iter_headers(data + data[:30], allow_partial_tail=True))) == 2
    with pytest.raises(ProtocolError):
        list(iter_headers(data + data[:30]))


def test_record_set_mixes_magics_and_validates_without_reading_records():
    legacy = LegacyBuilder(1)
    legacy.append(b"old", b"message", timestamp=5, offset=0)
    data = legacy.build() + _batch(base_offset=1)
    assert [b.magic for b in iter_batches(data)] == [1, 2]
    assert ensure_valid(data) == 2
    assert [r.offset for r in iter_records(data)] == [0, 1, 2]


@pytest.mark.parametrize("control_type", [ABORT, COMMIT])
def test_end_txn_marker_batch(control_type):
    marker = EndTransactionMarker(control_type, coordinator_epoch=17)
    data = build_end_txn_marker_batch(marker, producer_id=77, producer_epoch=2, timestamp=1234,
                                      base_offset=40, partition_leader_epoch=3)
    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.validate_crc() and theirs.is_control_batch and theirs.is_transactional
    assert [(r.type, r.offset, r.timestamp) for r in theirs] == [(control_type, 40, 1234)]

    batch = RecordBatch(data)
    assert batch.is_control and batch.is_transactional and batch.base_sequence == -1
    assert (batch.producer_id, batch.producer_epoch, batch.partition_leader_epoch) == (77, 2, 3)
    (record,) = list(batch)
    assert EndTransactionMarker.decode(record.key, record.value) == marker
    assert record.key == struct.pack(">hh", 0, control_type)
    assert record.value == struct.pack(">hi", 0, 17)


def test_control_batches_are_skipped_and_dropped_in_down_conversion():
    marker = build_end_txn_marker_batch(EndTransactionMarker(COMMIT, 1), producer_id=1,
                                        producer_epoch=0, timestamp=9, base_offset=2)
    data = _batch(producer_id=1, producer_epoch=0, is_transactional=True) + marker
    assert [r.offset for r in iter_records(data)] == [0, 1]
    assert [r.offset for r in iter_records(data, include_control=True)] == [0, 1, 2]
    assert [r.offset for r in iter_records(v2_to_legacy(data, 1))] == [0, 1]


def test_newer_control_key_versions_are_read():
    assert parse_control_key(b"\x00\x01\x00\x01extra") == (1, COMMIT)
    assert EndTransactionMarker.decode(b"\x00\x01\x00\x00", b"\x00\x01\x00\x00\x00\x05xx") == (
        EndTransactionMarker(ABORT, 5))


def test_empty_batch():
    data = RecordBatchBuilder(base_offset=10).build(last_offset_delta=4)
    batch = RecordBatch(data)
    batch.ensure_valid()
    assert (batch.records_count, batch.last_offset, batch.base_timestamp, list(batch)) == (0, 14, -1, [])
    assert v2_to_legacy(data, 1) == b""


def test_builder_misuse_is_a_programming_error():
    builder = RecordBatchBuilder()
    builder.append(b"k", b"v", offset=5)
    with pytest.raises(ValueError):
        builder.append(b"k", b"v", offset=5)
    with pytest.raises(TypeError):
        builder.append("text", b"v")
    with pytest.raises(ValueError):
        RecordBatchBuilder(compression=9)
    with pytest.raises(ValueError):
        RecordBatchBuilder(timestamp_type=1)
    with pytest.raises(ValueError):
        LegacyBuilder(1, compression=4)
    with pytest.raises(ValueError):
        LegacyBuilder(2)


def test_header_keys_that_are_not_utf8_round_trip():
    key = b"\xff\xfe".decode("utf-8", "surrogateescape")
    builder = RecordBatchBuilder()
    builder.append(b"k", b"v", headers=[(key, b"x")])
    (record,) = list(RecordBatch(builder.build()))
    assert record.headers == [(key, b"x")]
