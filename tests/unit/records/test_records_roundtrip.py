"""Hypothesis: builder -> reader round trips (checked by kafka-python's reader as well), conversions,
and fuzzed bytes that must end in ProtocolError or a clean parse, never another exception."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords

from odradek.protocol.exceptions import ProtocolError
from odradek.records import (
    LegacyBuilder, RecordBatchBuilder, codecs, iter_records, legacy_to_v2, v2_to_legacy,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

payloads = st.none() | st.binary(max_size=40)
header_lists = st.lists(st.tuples(st.text(max_size=8), payloads), max_size=3)
timestamps = st.integers(min_value=-1, max_value=2**50)


@st.composite
def batches(draw, with_headers=True):
    n = draw(st.integers(min_value=0, max_value=15))
    base = draw(st.integers(min_value=0, max_value=2**40))
    offsets, offset = [], base
    for _ in range(n):
        offsets.append(offset)
        offset += draw(st.integers(min_value=1, max_value=4))
    records = [(o, draw(payloads), draw(payloads), draw(header_lists) if with_headers else [],
                draw(timestamps)) for o in offsets]
    return base, records


def kafka_python_records(data):
    out, records = [], MemoryRecords(bytes(data))
    while records.has_next():
        batch = records.next_batch()
        out.extend((r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value) for r in batch)
    return out


@SETTINGS
@given(batches(), st.sampled_from(list(codecs.CODEC_NAMES)), st.booleans(),
       st.integers(min_value=-1, max_value=2**40), st.integers(min_value=-1, max_value=2**15 - 1),
       st.integers(min_value=-1, max_value=2**31 - 1))
def test_v2_round_trip(batch, codec, transactional, producer_id, producer_epoch, base_sequence):
    base, records = batch
    builder = RecordBatchBuilder(compression=codec, base_offset=base, producer_id=producer_id,
                                 producer_epoch=producer_epoch, base_sequence=base_sequence,
                                 is_transactional=transactional)
    for offset, key, value, headers, ts in records:
        builder.append(key, value, headers=headers, timestamp=ts, offset=offset)
    data = builder.build()
    read = list(iter_records(data))
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp) for r in read] == [
        (o, k, v, h, t) for o, k, v, h, t in records]
    if records:
        assert kafka_python_records(data) == [(o, t, k, v) for o, k, v, _, t in records]


@SETTINGS
@given(batches(with_headers=False), st.sampled_from(codecs.LEGACY_CODECS), st.sampled_from([0, 1]))
def test_legacy_round_trip_and_conversions(batch, codec, magic):
    base, records = batch
    builder = LegacyBuilder(magic, compression=codec, base_offset=base)
    for offset, key, value, _, ts in records:
        builder.append(key, value, timestamp=ts, offset=offset)
    data = builder.build()
    expected = [(o, t if magic else -1, k, v) for o, k, v, _, t in records]
    assert [(r.offset, r.timestamp, r.key, r.value) for r in iter_records(data)] == expected
    assert kafka_python_records(data) == expected

    v2 = legacy_to_v2(data)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in iter_records(v2)] == expected
    back = v2_to_legacy(v2, magic)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in iter_records(back)] == expected
    if records:
        assigned = legacy_to_v2(data, base_offset=10)
        assert [r.offset for r in iter_records(assigned)] == list(range(10, 10 + len(records)))


@SETTINGS
@given(batches(), st.sampled_from(list(codecs.CODEC_NAMES)), st.sampled_from([0, 1]))
def test_down_conversion_keeps_what_legacy_can_hold(batch, codec, magic):
    base, records = batch
    builder = RecordBatchBuilder(compression=codec, base_offset=base)
    for offset, key, value, headers, ts in records:
        builder.append(key, value, headers=headers, timestamp=ts, offset=offset)
    legacy = v2_to_legacy(builder.build(), magic)
    expected = [(o, t if magic else -1, k, v) for o, k, v, _, t in records]
    assert [(r.offset, r.timestamp, r.key, r.value) for r in iter_records(legacy)] == expected


def _parse_or_protocol_error(data, **kwargs):
    try:
        for _ in iter_records(data, check_crc=False, max_uncompressed_bytes=1 << 20, **kwargs):
            pass
    except ProtocolError:
        pass


def _sample(codec, magic):
    if magic == 2:
        builder = RecordBatchBuilder(compression=codec)
        for i in range(3):
            builder.append(b"key%d" % i, b"value" * i, headers=[("h", b"x")], timestamp=1000 + i)
    else:
        builder = LegacyBuilder(magic, compression=codec)
        for i in range(3):
            builder.append(b"key%d" % i, b"value" * i, timestamp=1000 + i)
    return builder.build()


SAMPLES = [_sample(c, 2) for c in codecs.CODEC_NAMES] + [
    _sample(c, m) for m in (0, 1) for c in codecs.LEGACY_CODECS]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(range(len(SAMPLES))),
       st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
                min_size=1, max_size=4),
       st.integers(min_value=0))
def test_fuzzed_batches_raise_only_protocol_error(index, flips, cut):
    data = bytearray(SAMPLES[index])
    for position, byte in flips:
        data[position % len(data)] = byte
    _parse_or_protocol_error(bytes(data))
    _parse_or_protocol_error(bytes(data[:cut % (len(data) + 1)]))
    _parse_or_protocol_error(bytes(data[:cut % (len(data) + 1)]), allow_partial_tail=True)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(codecs.CODEC_NAMES)[1:]), st.binary(max_size=200),
       st.integers(min_value=0, max_value=30), st.integers(min_value=0, max_value=255))
def test_fuzzed_compressed_data_raises_only_protocol_error(codec, payload, position, byte):
    data = bytearray(codecs.compress(codec, payload))
    data[position % len(data)] = byte
    try:
        codecs.decompress(codec, bytes(data), max_bytes=1 << 20)
    except ProtocolError:
        pass
