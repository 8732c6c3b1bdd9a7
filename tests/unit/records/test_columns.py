"""The bulk decoder (`odradek.records.columns`): every record of a run of batches, once, as columns.

Batches come from kafka-python's builders (a client written by others) and are checked against the
records given to those builders, for both of the decoder's paths (numpy, and the Python loop used for
small fetches). Malformed input raises ProtocolError on both paths, as the one-by-one reader does; a
fuzz run of corrupted batches shows the three readers agree record for record or all refuse.
"""

import random

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from odradek.protocol.exceptions import ProtocolError
from odradek.records import GZIP, LZ4, NONE, SNAPPY, ZSTD, RecordBatch, RecordBatchBuilder, iter_batches
from odradek.records import columns as columns_module
from odradek.records.columns import NUMPY_MIN_RECORDS, RecordColumns, decode_batches, load_bulk_decoder
from odradek.records.columns_numpy import ColumnSource
from tests.unit.records.test_records_malformed import INT32_MAX, record, v, v2

CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
PATHS = {"numpy": True, "python": False}
T0 = 1_700_000_000_000


def kafka_python_batch(records, *, codec=NONE, base_offset=0, timestamp_type=0) -> RecordBatch:
    """records: (offset_delta, timestamp, key, value, headers) built by kafka-python."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for delta, ts, key, value, headers in records:
        assert b.append(delta, ts, key, value, headers) is not None
    data = bytearray(b.build())
    data[0:8] = base_offset.to_bytes(8, "big", signed=True)
    return RecordBatch(bytes(data))


def columns(batches, first_offset=-(1 << 63), *, use_numpy: bool) -> list[tuple]:
    c = decode_batches(batches, first_offset, use_numpy=use_numpy)
    if use_numpy and len(c):   # the numpy path really ran (a failed import once fell back unnoticed)
        assert isinstance(c._source, ColumnSource)
    headers = c.headers if c.headers is not None else [()] * len(c)
    assert all(len(col) == len(c) for col in (c.timestamps, c.timestamp_types, c.keys, c.values, headers))
    return list(zip(c.offsets, c.timestamps, c.timestamp_types, c.keys, c.values, headers))


def expected(base_offset, records, first_offset=-(1 << 63), ts_type=0):
    return [(base_offset + d, ts, ts_type, k, val, tuple(h)) for d, ts, k, val, h in records
            if base_offset + d >= first_offset]


def random_records(r: random.Random, n: int, *, uniform: bool = False, gaps: bool = False) -> list[tuple]:
    out = []
    delta = 0
    for i in range(n):
        if uniform:
            key, value, headers, ts = None, bytes([i % 256]) * 100, [], T0 + i // 7
        else:
            key = None if r.random() < 0.3 else r.randbytes(r.randint(0, 40))
            value = None if r.random() < 0.05 else r.randbytes(r.choice((0, 1, 63, 64, 200, 3000)))
            headers = [] if r.random() < 0.8 else [
                (f"h{j}\u00e9", None if r.random() < 0.3 else r.randbytes(r.randint(0, 9)))
                for j in range(r.randint(1, 3))]
            ts = T0 + r.randint(-10_000, 10_000_000)
        out.append((delta, ts, key, value, headers))
        delta += r.randint(1, 5000) if gaps and r.random() < 0.1 else 1
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("codec", CODECS)
def test_records_built_by_kafka_python(codec, path):
    r = random.Random(codec)
    recs = random_records(r, 300, gaps=True)
    batch = kafka_python_batch(recs, codec=codec, base_offset=1_000)
    assert columns([batch], use_numpy=PATHS[path]) == expected(1_000, recs)


@pytest.mark.parametrize("path", PATHS)
def test_uniform_records_across_varint_widths(path):
    """Offset deltas past 64 and 8192 and timestamp deltas past 64 change the records' size: runs."""
    recs = [(i, T0 + i * 3, None, b"x" * 100, []) for i in range(20_000)]
    batch = kafka_python_batch(recs)
    assert columns([batch], use_numpy=PATHS[path]) == expected(0, recs)


@pytest.mark.parametrize("path", PATHS)
def test_several_batches_with_first_offset_and_log_append_time(path):
    r = random.Random(7)
    a = random_records(r, 150, uniform=True)
    b = random_records(r, 90)
    batches = [kafka_python_batch(a, base_offset=0), kafka_python_batch(b, base_offset=150, codec=LZ4)]
    builder = RecordBatchBuilder(base_offset=240, timestamp_type=1, log_append_time=T0 + 99)
    for i in range(70):
        builder.append(b"k", b"v%d" % i, timestamp=T0 + i)
    batches.append(RecordBatch(builder.build()))
    lat = [(240 + i, T0 + 99, 1, b"k", b"v%d" % i, ()) for i in range(70)]
    for first in (0, 3, 149, 150, 200, 239, 250, 310, 10**9):
        want = expected(0, a, first) + expected(150, b, first) + [x for x in lat if x[0] >= first]
        assert columns(batches, first, use_numpy=PATHS[path]) == want, first


def test_paths_choose_by_size_and_agree():
    r = random.Random(3)
    for n in (1, NUMPY_MIN_RECORDS - 1, NUMPY_MIN_RECORDS, 1000):
        recs = random_records(r, n)
        batch = kafka_python_batch(recs, codec=GZIP)
        auto = decode_batches([batch])
        assert list(zip(auto.offsets, auto.values)) == [(d, val) for d, _, _, val, _ in recs]
        assert columns([batch], use_numpy=True) == columns([batch], use_numpy=False) == expected(0, recs)


def test_empty_batch_list_and_slices():
    assert len(decode_batches([])) == 0
    recs = random_records(random.Random(5), 100)
    c = decode_batches([kafka_python_batch(recs)])
    part = c.slice(10, 20)
    assert part.offsets == list(range(10, 20)) and part.values == c.values[10:20]
    assert c.slice(0, len(c)) is c
    joined = c.slice(0, 10)
    joined.extend(c.slice(10, 100))
    assert (joined.offsets, joined.values, joined.headers) == (c.offsets, c.values, c.headers)


def test_columns_of_legacy_records():
    b = LegacyRecordBatchBuilder(magic=1, compression_type=GZIP, batch_size=1 << 30)
    b.append(0, T0, b"k", b"v")
    b.append(1, T0 + 1, None, None)
    (entry,) = iter_batches(bytes(b.build()))
    c = RecordColumns.of_records(list(entry.records()))
    assert (c.offsets, c.timestamps, c.timestamp_types, c.keys, c.values, c.headers) == (
        [0, 1], [T0, T0 + 1], [0, 0], [b"k", None], [b"v", None], None)


MALFORMED = {
    "records_count INT32_MAX": lambda: v2(record(), INT32_MAX),
    "records_count above records": lambda: v2(record() * 2, 3),
    "records_count below records": lambda: v2(record() * 2, 1),
    "record length negative": lambda: v2(record(length=v(-3)), 1),
    "record length past the end": lambda: v2(record(length=v(200)), 1),
    "record length short of its fields": lambda: v2(record(length=v(6)) + b"\x00" * 8, 2),
    "record length beyond its fields": lambda: v2(record(headers=b"\x00\x00", length=v(9)), 1),
    "key length -2": lambda: v2(v(8) + b"\x00\x00\x00" + v(-2) + b"\x02v\x00\x00", 1),
    "key length past the record": lambda: v2(v(7) + b"\x00\x00\x00" + v(50) + b"k\x00\x00", 1),
    "value length past the record": lambda: v2(v(7) + b"\x00\x00\x00\x00" + v(40) + b"\x00\x00", 1),
    "headers count negative": lambda: v2(record(headers=v(-1)), 1),
    "headers count INT32_MAX": lambda: v2(record(headers=v(INT32_MAX)), 1),
    "header key null": lambda: v2(record(headers=v(1) + v(-1) + v(-1)), 1),
    "header value length -3": lambda: v2(record(headers=v(1) + v(1) + b"h" + v(-3)), 1),
    "header value past the record": lambda: v2(record(headers=v(1) + v(1) + b"h" + v(9)), 1),
    "overlong varint record length": lambda: v2(b"\x80" * 6 + b"\x00" * 10, 1),
    "overlong varint offset delta": lambda: v2(record(off=b"\xff" * 5 + b"\x01"), 1),
    "varint wider than 32 bits": lambda: v2(record(off=b"\xff\xff\xff\xff\x7f"), 1),
    "overlong varlong timestamp delta": lambda: v2(record(ts=b"\x81" * 10 + b"\x01"), 1),
    "varlong wider than 64 bits": lambda: v2(record(ts=b"\xff" * 9 + b"\x7f"), 1),
    "truncated varint in a record": lambda: v2(record(headers=b"\x80"), 1),
    "corrupt gzip section": lambda: v2(b"\x1f\x8b" + b"\x00" * 30, 1, codec=1),
    "empty batch with bytes": lambda: v2(b"\x00" * 7, 0),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_records_raise_protocol_error(case, path):
    good = kafka_python_batch(random_records(random.Random(1), 100, uniform=True))
    bad = RecordBatch(MALFORMED[case]())
    with pytest.raises(ProtocolError):
        list(bad.records(check_crc=False))     # the one-by-one reader refuses it too
    with pytest.raises(ProtocolError):
        decode_batches([good, bad], use_numpy=PATHS[path])


def reference(batch: RecordBatch) -> list[tuple]:
    return [(r.offset, r.timestamp, batch.timestamp_type, r.key, r.value, tuple(r.headers))
            for r in batch.records(check_crc=False)]


def outcome(fn):
    try:
        return fn()
    except ProtocolError as e:
        return ("ProtocolError", "64-bit" in str(e))


def test_fuzzed_batches_read_the_same_on_every_path():
    r = random.Random(11)
    seeds = [kafka_python_batch(random_records(r, 120)), kafka_python_batch(random_records(r, 100, uniform=True))]
    agreed = refused = 0
    for i in range(700):
        data = bytearray(seeds[i % 2].buf)
        for _ in range(r.randint(1, 4)):
            data[r.randrange(61, len(data))] = r.randrange(256)
        batch = RecordBatch(bytes(data))
        ref = outcome(lambda: reference(batch))
        fast = outcome(lambda: columns([batch], use_numpy=True))
        slow = outcome(lambda: columns([RecordBatch(bytes(data))], use_numpy=False))
        assert fast == slow
        if fast == ("ProtocolError", True):   # a timestamp outside int64: refused here, not there
            continue
        assert (fast[0] == "ProtocolError") == (ref[0] == "ProtocolError")
        if isinstance(ref, list):
            assert fast == ref
            agreed += 1
        else:
            refused += 1
    assert agreed > 50 and refused > 50


@pytest.mark.parametrize("path", PATHS)
def test_joined_values_as_the_console_consumer_prints_them(path):
    uniform = [(i, T0 + i, None, b"%05d" % i, []) for i in range(300)]
    mixed = random_records(random.Random(9), 200)
    for recs in (uniform, mixed):
        c = decode_batches([kafka_python_batch(recs)], use_numpy=PATHS[path])
        want = b"".join((b"NULL" if v is None else v) + b"\n" for _, _, _, v, _ in recs)
        assert c.joined_values(b"\n", b"NULL") == want
        part = c.slice(17, 250)
        assert part.joined_values(b"--", b"") == b"".join((v or b"") + b"--" for _, _, _, v, _ in recs[17:250])
        assert part.offsets == list(range(17, min(250, len(recs)))) and part.last_offset == part.offsets[-1]


def test_lazy_columns_slice_and_extend_like_lists():
    recs = random_records(random.Random(4), 500)
    lazy = decode_batches([kafka_python_batch(recs)], use_numpy=True)
    eager = decode_batches([kafka_python_batch(recs)], use_numpy=False)
    a, b = lazy.slice(0, 123), lazy.slice(123, 500)
    assert a.values == eager.values[:123]          # made on first read, for the slice only
    a.extend(b)
    assert (a.offsets, a.timestamps, a.keys, a.values, a.headers) == (
        eager.offsets, eager.timestamps, eager.keys, eager.values, eager.headers)
    assert len(a) == 500 and a.last_offset == 499


def test_the_bulk_decoder_loads_with_numpy_installed():
    """numpy is a dependency: the numpy path loads (a consumer loads it when it starts), and a decode of
    NUMPY_MIN_RECORDS records takes it without being asked."""
    assert load_bulk_decoder() is True
    assert columns_module._numpy_path is not None
    recs = random_records(random.Random(5), NUMPY_MIN_RECORDS, uniform=True)
    assert isinstance(decode_batches([kafka_python_batch(recs)])._source, ColumnSource)


@pytest.mark.parametrize("codec", [NONE, LZ4])
def test_keys_and_values_in_runs_of_one_size(codec):
    """Runs of one key or value size (the numpy path reads each run at once): null, empty, one byte,
    values ending in zero bytes, runs across batch boundaries, values of one size at irregular
    distances, then sizes varying record by record; both paths agree with what kafka-python was
    given."""
    recs = []
    for run, (key_size, value_size) in enumerate([(None, 100), (8, 100), (8, None), (None, 0), (1, 1), (3, 5000)]):
        for i in range(300):
            j = run * 300 + i
            key = None if key_size is None else (b"%08d" % j)[-key_size:]
            zeros = min(2, value_size or 0)
            value = None if value_size is None else bytes([1 + j % 250]) * (value_size - zeros) + b"\0" * zeros
            recs.append((j, T0 + j, key, value, []))
    r = random.Random(7)
    for j in range(len(recs), len(recs) + 300):   # values of one size at irregular distances
        recs.append((j, T0 + j, r.randbytes(r.randint(0, 9)), r.randbytes(50), []))
    for j in range(len(recs), len(recs) + 300):
        recs.append((j, T0 + j, r.randbytes(r.randint(0, 9)), r.randbytes(r.randint(0, 300)), []))
    batches = [kafka_python_batch(recs[:1000], codec=codec), kafka_python_batch(
        [(d - 1000, ts, k, val, h) for d, ts, k, val, h in recs[1000:]], codec=codec, base_offset=1000)]
    want = expected(0, recs)
    assert columns(batches, use_numpy=True) == want
    assert columns(batches, use_numpy=False) == want
    assert columns(batches, 950, use_numpy=True) == want[950:]
    for key, value in ((b"", None), (None, b""), (b"k", b"")):   # a whole column of one size
        recs = [(j, T0, key, value, []) for j in range(NUMPY_MIN_RECORDS)]
        assert columns([kafka_python_batch(recs, codec=codec)], use_numpy=True) == expected(0, recs)


def test_vectorised_varints_of_every_size():
    """The numpy varint reader (short ones at once, longer ones byte by byte) against the scalar one,
    for varints of 1 to 10 bytes mixed, and its refusals."""
    import numpy as np

    from odradek.records.columns_numpy import _uvarints
    from odradek.records.varint import encode_uvarint, read_uvarint

    r = random.Random(11)
    values = [r.randrange(1 << r.choice((7, 14, 21, 28, 35, 63, 64))) for _ in range(2000)]
    data = b"".join(encode_uvarint(u) for u in values) + bytes(16)
    pos, at = [], 0
    for _ in values:
        pos.append(at)
        at = read_uvarint(data, at, len(data), 10, "varlong")[1]
    u, size = _uvarints(np.frombuffer(data, np.uint8), np.array(pos, np.int64), 10, "varlong")
    assert u.tolist() == values
    assert size.tolist() == [len(encode_uvarint(v)) for v in values]
    with pytest.raises(ProtocolError, match="longer than 5 bytes"):
        _uvarints(np.frombuffer(b"\x01" + encode_uvarint(1 << 35) + bytes(16), np.uint8), np.array([0, 1]), 5, "v")
