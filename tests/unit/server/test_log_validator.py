"""The broker's produce validation (`server.log_validator`), case by case against Kafka's LogValidator:
each lie gets Kafka's error code (and KIP-467 record errors where Kafka lists them), good batches come
out with a true max_timestamp, legacy sets come out as one v2 batch that kafka-python reads the same,
and bombs are refused within their bound. No event loop, no sockets."""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from odradek.protocol.error_codes import ErrorCode
from odradek.records import GZIP, LZ4, NONE, SNAPPY, ZSTD, RecordBatch, RecordBatchBuilder, codecs
from odradek.server.log_validator import (
    CREATE_TIME, INLINE_INFLATE_MAX, INLINE_LOOP_MAX, INLINE_MAX_RECORDS, LOG_APPEND_TIME, InvalidRecords,
    NeedsWorker, TopicRules, max_uncompressed_bytes, validate,
)

from ..records.lying_batches import (
    gzip_bomb_wrapper, good_records, legacy_message, legacy_wrapper, rec, v2_batch,
)

NOW = 1_700_000_000_000
HOUR = 3_600_000
YEAR = 365 * 24 * HOUR


def rules(**kw) -> TopicRules:
    base = dict(max_message_bytes=1048588, timestamp_type=CREATE_TIME, timestamp_before_max_ms=2**63 - 1,
                timestamp_after_max_ms=HOUR, compacted=False)
    base.update(kw)
    return TopicRules(**base)


def refused(records, *, api_version: int | None = 9, **kw) -> InvalidRecords:
    with pytest.raises(InvalidRecords) as e:
        validate(bytearray(records), rules(**kw), NOW, api_version)
    return e.value


def ours(n: int = 3, codec: int = NONE, **kw) -> bytes:
    b = RecordBatchBuilder(compression=codec, **kw)
    for i in range(n):
        b.append(b"k%d" % i, b"value %d" % i, timestamp=NOW + i)
    return b.build()


# ------------------------------------------------------------------------------------------ good input
@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
@pytest.mark.parametrize("n", [1, 5, 500])
def test_good_batches_pass_unchanged(codec, n):
    data = ours(n, codec)
    out = validate(bytearray(data), rules(), NOW, 9)
    assert bytes(out.buffer) == data and out.record_count == n and out.batch_count == 1


def test_a_header_lying_about_its_max_timestamp_is_rewritten():
    data = v2_batch(good_records(60, deltas=[i * 3 for i in range(60)]), 60, base_timestamp=NOW,
                    max_timestamp=NOW + 10 * YEAR)
    out = validate(bytearray(data), rules(), NOW, 9)
    theirs = DefaultRecordBatch(bytearray(out.buffer))
    assert theirs.validate_crc() and theirs.max_timestamp == NOW + 59 * 3
    assert max(r.timestamp for r in theirs) == NOW + 59 * 3


def test_log_append_time_topics_stamp_now():
    out = validate(bytearray(ours(4)), rules(timestamp_type=LOG_APPEND_TIME), NOW + 5, 9)
    batch = RecordBatch(bytes(out.buffer))
    batch.ensure_valid()
    assert batch.timestamp_type == 1 and [r.timestamp for r in batch] == [NOW + 5] * 4


# ------------------------------------------------------------------------------------------ lies
@pytest.mark.parametrize("n", [1, 100])
def test_count_larger_than_the_records(n):
    e = refused(v2_batch(good_records(n), n + 4, base_timestamp=NOW))
    assert e.error == ErrorCode.INVALID_RECORD and f"declares {n + 4} records" in e.message


def test_count_smaller_than_the_records():
    e = refused(v2_batch(good_records(3), 1, base_timestamp=NOW))
    assert e.error == ErrorCode.INVALID_RECORD and "left over" in e.message


@pytest.mark.parametrize("codec", [NONE, GZIP, ZSTD])
def test_record_and_key_lengths_past_their_bounds(codec):
    records = good_records(9)
    for lie in (rec(9, length=5000), rec(9, key_length=300)):
        e = refused(v2_batch(records + lie, 10, base_timestamp=NOW, codec=codec))
        assert e.error == ErrorCode.INVALID_RECORD and "record 9" in e.message


def test_timestamp_ten_years_ahead_in_a_batch_saying_now():
    deltas = [0] * 70
    deltas[42] = 10 * YEAR
    e = refused(v2_batch(good_records(70, deltas=deltas), 70, base_timestamp=NOW, max_timestamp=NOW))
    assert e.error == ErrorCode.INVALID_TIMESTAMP
    assert [i for i, _ in e.record_errors] == [42] and "out of range" in e.record_errors[0][1]


def test_timestamp_too_old_with_before_max():
    e = refused(v2_batch(good_records(2, deltas=[0, -2 * HOUR]), 2, base_timestamp=NOW),
                timestamp_before_max_ms=HOUR)
    assert e.error == ErrorCode.INVALID_TIMESTAMP and [i for i, _ in e.record_errors] == [1]


def test_log_append_time_topics_do_not_check_record_timestamps():
    data = v2_batch(good_records(2, deltas=[0, 10 * YEAR]), 2, base_timestamp=NOW)
    assert validate(bytearray(data), rules(timestamp_type=LOG_APPEND_TIME), NOW, 9).record_count == 2


def test_compacted_topics_list_the_records_without_keys():
    records = b"".join(rec(i, key=None if i in (1, 30) else b"k") for i in range(40))
    e = refused(v2_batch(records, 40, base_timestamp=NOW), compacted=True)
    assert e.error == ErrorCode.INVALID_RECORD
    assert [i for i, _ in e.record_errors] == [1, 30]
    assert all("without a key" in text for _, text in e.record_errors)


@pytest.mark.parametrize("case, kw, code", [
    ("base offset", {"base_offset": 5}, ErrorCode.INVALID_RECORD),
    ("last offset delta", {"last_offset_delta": 7}, ErrorCode.INVALID_RECORD),
    ("control batch", {"attributes": 0x20}, ErrorCode.INVALID_RECORD),
    ("producer id without a sequence", {"producer_id": 12}, ErrorCode.INVALID_RECORD),
    ("LogAppendTime from a producer", {"attributes": 0x08}, ErrorCode.INVALID_TIMESTAMP),
    ("unknown codec", {"attributes": 0x06}, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE),
])
def test_header_lies(case, kw, code):
    assert refused(v2_batch(good_records(3), 3, base_timestamp=NOW, **kw)).error == code, case


def test_framing_crc_size_and_batch_count():
    good = ours(3)
    assert refused(good[:-1]).error == ErrorCode.CORRUPT_MESSAGE
    assert refused(good[:10]).error == ErrorCode.CORRUPT_MESSAGE
    flipped = bytearray(good)
    flipped[-1] ^= 1
    assert refused(flipped).error == ErrorCode.CORRUPT_MESSAGE
    e = refused(good + ours(2))
    assert e.error == ErrorCode.INVALID_RECORD and "exactly one record batch" in e.message
    assert refused(good, max_message_bytes=len(good) - 1).error == ErrorCode.MESSAGE_TOO_LARGE
    magic3 = bytearray(good)
    magic3[16] = 3
    assert refused(magic3).error == ErrorCode.CORRUPT_MESSAGE
    assert refused(b"").error == ErrorCode.INVALID_RECORD


def test_produce_versions():
    assert refused(ours(2, ZSTD), api_version=6).error == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert validate(bytearray(ours(2, ZSTD)), rules(), NOW, 7).record_count == 2
    e = refused(legacy_message(b"k", b"v"), api_version=3)
    assert e.error == ErrorCode.INVALID_RECORD and "magic 2" in e.message
    assert refused(legacy_message(b"k", b"v") + ours(1), api_version=2).error == ErrorCode.INVALID_RECORD


# ------------------------------------------------------------------------------------------ bombs
def test_zstd_batch_declaring_8m_records_is_refused_before_inflating(monkeypatch):
    n = 8_000_000
    data = v2_batch(rec(0, key=b"k", value=b"") * n, n, base_timestamp=NOW, codec=ZSTD)
    assert len(data) < 16 * 1024

    def inflate(*args, **kwargs):
        raise AssertionError("the batch was inflated")

    monkeypatch.setattr(codecs, "decompress", inflate)
    e = refused(data, compacted=True)
    assert e.error == ErrorCode.MESSAGE_TOO_LARGE and "8000000" in e.message


def test_compressed_batch_inflating_past_the_cap():
    cap = max_uncompressed_bytes(100_000)
    big = b"".join(rec(i, key=b"k", value=b"\x00" * 60_000) for i in range(cap // 60_000 + 2))
    data = v2_batch(big, cap // 60_000 + 2, base_timestamp=NOW, codec=GZIP)
    assert len(data) < 100_000
    assert refused(data, max_message_bytes=100_000).error == ErrorCode.MESSAGE_TOO_LARGE


def test_compressed_batch_lying_about_its_count():
    n = 200_000
    data = v2_batch(b"".join(rec(i % 64) for i in range(n)), 1, base_timestamp=NOW, codec=ZSTD)
    assert refused(data).error == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("why", ["many records", "a big inflation"])
def test_inline_validation_hands_big_work_to_the_workers_unchanged(why):
    n = INLINE_INFLATE_MAX // 7 + 100 if why == "many records" else 3
    value = b"" if why == "many records" else b"\x00" * (INLINE_INFLATE_MAX // 2)
    data = v2_batch(good_records(n, value=value, key=b"k"), n, base_timestamp=NOW, max_timestamp=NOW + 1,
                    codec=LZ4)
    assert len(data) < INLINE_INFLATE_MAX
    buf = bytearray(data)
    with pytest.raises(NeedsWorker):
        validate(buf, rules(), NOW, 9, inline=True)
    assert bytes(buf) == data
    out = validate(buf, rules(), NOW, 9)
    assert out.record_count == n and RecordBatch(bytes(out.buffer)).max_timestamp == NOW


# ------------------------------------------------------------------------------------------ legacy
@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4])
def test_legacy_sets_from_kafka_python_become_one_v2_batch(magic, codec):
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 30)
    rows = [(None if i % 5 == 0 else b"key%d" % i, b"value %d" % i, NOW + i) for i in range(50)]
    for i, (key, value, ts) in enumerate(rows):
        builder.append(i, timestamp=ts if magic else None, key=key, value=value)
    out = validate(bytearray(builder.build()), rules(), NOW, 2)
    assert out.converted and out.record_count == 50
    theirs = DefaultRecordBatch(bytearray(out.buffer))
    assert theirs.validate_crc() and theirs.compression_type == codec
    assert [(r.offset, r.key, r.value, r.timestamp) for r in theirs] == [
        (i, key, value, ts if magic else -1) for i, (key, value, ts) in enumerate(rows)]


def test_legacy_gzip_bomb_is_refused_within_the_cap():
    wrapper = gzip_bomb_wrapper(1_900_000)
    assert len(wrapper) < 200_000
    e = refused(wrapper, api_version=2)
    assert e.error == ErrorCode.MESSAGE_TOO_LARGE


def test_legacy_lies():
    inner = legacy_message(b"a", b"1") + legacy_message(b"b", b"2")
    two_wrappers = legacy_wrapper(inner) + legacy_wrapper(inner)
    assert refused(two_wrappers, api_version=2).error == ErrorCode.INVALID_RECORD
    assert refused(legacy_wrapper(inner) + legacy_message(b"k", b"v"), api_version=2).error \
        == ErrorCode.INVALID_RECORD
    mixed = legacy_message(b"a", b"1", magic=0) + legacy_message(b"b", b"2", magic=1)
    assert refused(mixed, api_version=2).error == ErrorCode.INVALID_RECORD
    bad_inner_crc = legacy_message(b"a", b"1") + legacy_message(b"b", b"2", crc=5)
    assert refused(legacy_wrapper(bad_inner_crc), api_version=2).error == ErrorCode.CORRUPT_MESSAGE
    nested = legacy_message(b"a", b"1") + legacy_wrapper(legacy_message(b"x", b"y"))
    e = refused(legacy_wrapper(nested), api_version=2)
    assert e.error == ErrorCode.INVALID_RECORD and [i for i, _ in e.record_errors] == [1]
    e = refused(legacy_wrapper(inner, attributes=0x08), api_version=2)
    assert e.error == ErrorCode.INVALID_TIMESTAMP and [i for i, _ in e.record_errors] == [0, 1]
    keyless = legacy_message(None, b"1", timestamp=NOW) + legacy_message(b"b", b"2", timestamp=NOW)
    e = refused(keyless, api_version=2, compacted=True)
    assert e.error == ErrorCode.INVALID_RECORD and [i for i, _ in e.record_errors] == [0]
    future = legacy_message(b"a", b"1", timestamp=NOW + YEAR)
    assert refused(legacy_wrapper(future, SNAPPY), api_version=2).error == ErrorCode.INVALID_TIMESTAMP


def test_legacy_converted_batch_must_fit_max_message_bytes():
    message = legacy_message(None, b"x" * 100, magic=0)
    assert len(message) < 150
    e = refused(message, api_version=1, max_message_bytes=150)
    assert e.error == ErrorCode.MESSAGE_TOO_LARGE and "converted" in e.message


def test_legacy_inline_budget():
    small = legacy_message(b"k", b"v", timestamp=NOW)
    assert validate(bytearray(small), rules(), NOW, 2, inline=True).record_count == 1
    with pytest.raises(NeedsWorker):
        validate(bytearray(small * 400), rules(), NOW, 2, inline=True)
    assert struct.unpack_from(">i", bytes(validate(bytearray(small * 400), rules(), NOW, 2).buffer), 57)[0] == 400


def test_inline_budget_for_records_checked_one_at_a_time():
    # Records of varied sizes are framed one at a time: past INLINE_LOOP_MAX of them, a worker's job.
    n = INLINE_LOOP_MAX + 500
    records = b"".join(rec(i, key=b"k", value=b"v" * (i % 97)) for i in range(n))
    data = v2_batch(records, n, base_timestamp=NOW)
    with pytest.raises(NeedsWorker):
        validate(bytearray(data), rules(), NOW, 9, inline=True)
    assert validate(bytearray(data), rules(), NOW, 9).record_count == n
    # Equal sizes are checked in bulk: inline, up to INLINE_MAX_RECORDS.
    uniform = v2_batch(good_records(n), n, base_timestamp=NOW)
    assert validate(bytearray(uniform), rules(), NOW, 9, inline=True).record_count == n
    many = INLINE_MAX_RECORDS + 1
    with pytest.raises(NeedsWorker):
        validate(bytearray(v2_batch(good_records(many), many, base_timestamp=NOW)), rules(), NOW, 9, inline=True)
