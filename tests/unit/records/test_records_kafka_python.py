"""Compatibility with a client written by others: kafka-python's record builders and readers.

Batches built by kafka-python must read the same through odradek.records, and batches we build must
read the same through kafka-python, for magic 0, 1 and 2 and every codec kafka-python supports. The
oracle needs python-snappy, lz4, zstandard and xxhash: a missing one fails here, loudly.
"""

import pytest
import kafka.codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from odradek.records import (
    GZIP, LZ4, NONE, SNAPPY, ZSTD, LegacyBatch, LegacyBuilder, RecordBatch, RecordBatchBuilder,
    iter_batches, iter_records, legacy_to_v2, v2_to_legacy,
)
from odradek.records.header import set_max_timestamp

V2_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
LEGACY_CODECS = [NONE, GZIP, SNAPPY, LZ4]

BIG = (b"odradek spool of thread " * 9000)[:200_000]  # several lz4 and xerial blocks
RECORDS = [
    (b"key-0", b"value-0", [("h1", b"v1"), ("h\u00e9", b"")], 1_700_000_000_000),
    (None, b"value with null key", [], 1_700_000_000_005),
    (b"key-2", None, [("tombstone", None)], 1_699_999_999_990),  # negative timestamp delta
    (b"", b"", [], 1_700_000_000_001),
    (b"big", BIG, [("n", b"x" * 300)], 1_700_000_000_002),
]


def test_oracle_has_every_codec():
    assert kafka.codec.has_gzip() and kafka.codec.has_snappy()
    assert kafka.codec.has_lz4() and kafka.codec.has_zstd()
    assert kafka.codec.xxhash is not None  # kafka-python's magic 0 lz4 needs it


def kp_fields(record, magic=2):
    timestamp = -1 if record.timestamp is None else record.timestamp
    if magic == 2:
        return (record.offset, timestamp, record.key, record.value, list(record.headers))
    return (record.offset, timestamp, record.key, record.value)


def our_fields(record, magic=2):
    if magic == 2:
        return (record.offset, record.timestamp, record.key, record.value, record.headers)
    return (record.offset, record.timestamp, record.key, record.value)


def kp_read_all(data):
    records = MemoryRecords(bytes(data))
    out = []
    while records.has_next():
        batch = records.next_batch()
        if isinstance(batch, DefaultRecordBatch):
            assert batch.validate_crc()
        out.extend(batch)
    return out


@pytest.mark.parametrize("codec", V2_CODECS)
def test_v2_built_by_kafka_python_reads_the_same(codec):
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=True, producer_id=4242, producer_epoch=7,
        base_sequence=100, batch_size=1 << 30)
    for i, (key, value, headers, ts) in enumerate(RECORDS):
        assert builder.append(i, ts, key, value, headers) is not None
    data = bytes(builder.build())

    ours = RecordBatch(data)
    theirs = DefaultRecordBatch(bytearray(data))
    ours.ensure_valid()
    assert (ours.compression, ours.producer_id, ours.producer_epoch, ours.base_sequence) == (
        codec, 4242, 7, 100)
    assert ours.is_transactional and not ours.is_control
    assert (ours.records_count, ours.last_offset_delta, ours.max_timestamp) == (
        theirs.records_count, theirs.last_offset_delta, theirs.max_timestamp)
    assert [our_fields(r) for r in ours] == [kp_fields(r) for r in theirs]
    assert [our_fields(r) for r in ours] == [(i, ts, k, v, h) for i, (k, v, h, ts) in enumerate(RECORDS)]


@pytest.mark.parametrize("codec", V2_CODECS)
def test_v2_built_by_us_reads_the_same_in_kafka_python(codec):
    builder = RecordBatchBuilder(
        compression=codec, base_offset=1000, producer_id=99, producer_epoch=3, base_sequence=5,
        is_transactional=True, partition_leader_epoch=12)
    for key, value, headers, ts in RECORDS:
        builder.append(key, value, headers=headers, timestamp=ts)
    builder.append(b"gap", b"after a gap", timestamp=1_700_000_000_100, offset=1010)
    data = builder.build()

    theirs = DefaultRecordBatch(bytearray(data))
    assert theirs.validate_crc()
    assert (theirs.base_offset, theirs.compression_type, theirs.producer_id, theirs.producer_epoch,
            theirs.base_sequence, theirs.is_transactional, theirs.leader_epoch) == (
        1000, codec, 99, 3, 5, True, 12)
    assert theirs.last_offset_delta == 10 and theirs.records_count == len(RECORDS) + 1
    assert theirs.max_timestamp == 1_700_000_000_100
    expected = [(1000 + i, ts, k, v, h) for i, (k, v, h, ts) in enumerate(RECORDS)]
    expected.append((1010, 1_700_000_000_100, b"gap", b"after a gap", []))
    assert [kp_fields(r) for r in theirs] == expected
    assert [our_fields(r) for r in RecordBatch(data)] == expected


def test_log_append_time_batch_reads_the_same_in_kafka_python():
    builder = RecordBatchBuilder(timestamp_type=1, log_append_time=1_800_000_000_000)
    builder.append(b"k", b"v", timestamp=5)
    data = builder.build()
    assert [r.timestamp for r in DefaultRecordBatch(bytearray(data))] == [1_800_000_000_000]
    assert [r.timestamp for r in RecordBatch(data)] == [1_800_000_000_000]


def test_set_max_timestamp_patches_what_kafka_python_reads():
    builder = RecordBatchBuilder(compression=GZIP)
    builder.append(b"k", b"v", timestamp=5)
    data = bytearray(builder.build())
    set_max_timestamp(data, 0, 1, 1_900_000_000_000)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc() and theirs.timestamp_type == 1
    assert [r.timestamp for r in theirs] == [1_900_000_000_000]
    assert [r.timestamp for r in RecordBatch(bytes(data))] == [1_900_000_000_000]


@pytest.mark.parametrize("codec", V2_CODECS)
def test_memory_records_of_several_batches(codec):
    builder = MemoryRecordsBuilder(magic=2, compression_type=codec, batch_size=1 << 20, offset=0)
    for key, value, headers, ts in RECORDS:
        builder.append(timestamp=ts, key=key, value=value, headers=headers)
    builder.close()
    first = bytes(builder.buffer())
    ours = RecordBatchBuilder(compression=codec, base_offset=len(RECORDS))
    for key, value, headers, ts in RECORDS:
        ours.append(key, value, headers=headers, timestamp=ts)
    data = first + ours.build()
    assert [our_fields(r) for r in iter_records(data)] == [kp_fields(r) for r in kp_read_all(data)]
    assert [r.offset for r in iter_records(data)] == list(range(2 * len(RECORDS)))


LEGACY_RECORDS = [(k, v, ts) for k, v, _, ts in RECORDS]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS)
def test_legacy_built_by_kafka_python_reads_the_same(magic, codec):
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 30)
    for i, (key, value, ts) in enumerate(LEGACY_RECORDS):
        builder.append(i, ts, key, value)
    data = bytes(builder.build())
    theirs = kp_read_all(data)
    ours = list(iter_records(data))
    assert [our_fields(r, magic) for r in ours] == [kp_fields(r, magic) for r in theirs]
    assert [r.timestamp_type for r in ours] == [-1 if magic == 0 else 0] * len(ours)
    assert [(r.key, r.value) for r in ours] == [(k, v) for k, v, _ in LEGACY_RECORDS]
    if magic == 1:
        assert [r.timestamp for r in ours] == [ts for _, _, ts in LEGACY_RECORDS]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS)
def test_legacy_built_by_us_reads_the_same_in_kafka_python(magic, codec):
    builder = LegacyBuilder(magic, compression=codec, base_offset=500)
    for key, value, ts in LEGACY_RECORDS:
        builder.append(key, value, timestamp=ts)
    builder.append(b"gap", b"after a gap", timestamp=1_700_000_000_100, offset=520)
    data = builder.build()
    entries = list(iter_batches(data))
    assert len(entries) == (1 if codec else len(LEGACY_RECORDS) + 1)
    assert all(isinstance(e, LegacyBatch) and e.is_valid() for e in entries)
    timestamps = [ts if magic else -1 for _, _, ts in LEGACY_RECORDS] + [
        1_700_000_000_100 if magic else -1]
    expected = [(500 + i, timestamps[i], k, v) for i, (k, v, _) in enumerate(LEGACY_RECORDS)]
    expected.append((520, timestamps[-1], b"gap", b"after a gap"))
    assert [kp_fields(r, magic) for r in kp_read_all(data)] == expected
    assert [our_fields(r, magic) for r in iter_records(data)] == expected


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS)
def test_conversions_read_the_same_in_kafka_python(magic, codec):
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 30)
    for i, (key, value, ts) in enumerate(LEGACY_RECORDS):
        builder.append(i, ts, key, value)
    legacy = bytes(builder.build())
    expected = [kp_fields(r, magic) for r in kp_read_all(legacy)]

    v2 = legacy_to_v2(legacy)
    batches = list(iter_batches(v2))
    assert all(isinstance(b, RecordBatch) and b.compression == codec for b in batches)
    assert [kp_fields(r, 2)[:4] for r in kp_read_all(v2)] == expected

    back = v2_to_legacy(v2, magic)
    assert [kp_fields(r, magic) for r in kp_read_all(back)] == expected
    assert all(b.compression == codec for b in iter_batches(back))


def test_v1_to_v2_to_v1_preserves_offsets_and_timestamps_of_a_stored_wrapper():
    builder = LegacyBuilder(1, compression=SNAPPY, base_offset=7_000)
    for i, (key, value, ts) in enumerate(LEGACY_RECORDS):
        builder.append(key, value, timestamp=ts, offset=7_000 + 2 * i)  # compacted: gaps
    v1 = builder.build()
    v2 = legacy_to_v2(v1)
    back = v2_to_legacy(v2, 1)
    expected = [(7_000 + 2 * i, ts, k, v) for i, (k, v, ts) in enumerate(LEGACY_RECORDS)]
    for data in (v1, v2, back):
        assert [kp_fields(r, 1)[:4] for r in kp_read_all(data)] == expected
    assert LegacyBatch(back).offset == LegacyBatch(v1).offset == 7_008
