"""The test helper's batches are read correctly by another implementation (kafka-python)."""

from kafka.record.default_records import DefaultRecordBatch

from tests.unit.storage.batches import batch


def test_kafka_python_reads_helper_batches():
    raw = batch([b"a", b"bb", b"ccc"], base_offset=7, base_timestamp=5_000,
                timestamp_deltas=[0, 3, 9], leader_epoch=4)
    parsed = DefaultRecordBatch(bytearray(raw))
    assert parsed.validate_crc()
    assert parsed.base_offset == 7
    assert parsed.leader_epoch == 4
    assert parsed.max_timestamp == 5_009
    records = list(parsed)
    assert [r.value for r in records] == [b"a", b"bb", b"ccc"]
    assert [r.offset for r in records] == [7, 8, 9]
    assert [r.timestamp for r in records] == [5_000, 5_003, 5_009]
