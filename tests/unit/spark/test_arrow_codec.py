"""v2 batches <-> Arrow (odradek.spark.decode / encode), checked against batches built and read by
kafka-python (someone else's codec) and by odradek.records."""

import random

import numpy as np
import pyarrow as pa
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from odradek.client import murmur2 as client_murmur2
from odradek.records import RecordBatch, RecordBatchBuilder
from odradek.records.header import set_max_timestamp
from odradek.spark import decode as D
from odradek.spark import encode as E

HEADERS = pa.list_(pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())])))
SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
                    ("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")),
                    ("timestampType", pa.int32())])
SCHEMA_H = SCHEMA.append(pa.field("headers", HEADERS))


def kp_batch(base_offset, records, *, log_append_time=False, compression=0):
    """A batch built by kafka-python: records are (offset_delta, ts, key, value, headers)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 30)
    for od, ts, k, v, h in records:
        b.append(od, timestamp=ts, key=k, value=v, headers=h)
    data = bytearray(b.build())
    data[0:8] = base_offset.to_bytes(8, "big")
    if log_append_time:   # as a broker does: attributes bit 3, max timestamp, CRC recomputed
        set_max_timestamp(data, 0, 1, 99_000)
    return bytes(data)


def random_records(rng, n, start_ts=1_700_000_000_000):
    out = []
    for i in range(n):
        key = None if rng.random() < 0.2 else bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        value = None if rng.random() < 0.05 else bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400)))
        headers = [(f"h{j}", None if j == 2 else bytes([j]) * j) for j in range(rng.randrange(0, 4))] \
            if rng.random() < 0.3 else []
        out.append((i, start_ts + rng.randrange(-5, 5000), key, value, headers))
    return out


def expected_rows(base, records, topic="t", partition=3):
    return [{"key": k, "value": v, "topic": topic, "partition": partition, "offset": base + od,
             "ts_ms": ts, "timestampType": 0, "headers": [{"key": hk, "value": hv} for hk, hv in h] or None}
            for od, ts, k, v, h in records]


def rows_of(rb):
    out = []
    for r in rb.to_pylist():
        r = dict(r)
        r["ts_ms"] = int(r.pop("timestamp").timestamp() * 1000 + 0.5) if r.get("timestamp") else None
        out.append(r)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_decode_matches_kafka_python_batches(seed):
    rng = random.Random(seed)
    datas, want = [], []
    base = 1000
    for _ in range(rng.randrange(1, 5)):
        recs = random_records(rng, rng.randrange(1, 300))
        datas.append(kp_batch(base, recs))
        want += expected_rows(base, recs)
        base += len(recs) + rng.randrange(0, 3)           # gaps between batches are allowed
    rb = D.decode(datas, 0, 1 << 62, "t", 3, True, SCHEMA_H)
    assert rb.schema.equals(SCHEMA_H)
    assert rows_of(rb) == want


def test_decode_filters_the_range_and_fixed_size_runs():
    recs = [(i, 5, None, b"x" * 100, []) for i in range(2000)]        # fixed-size runs
    data = kp_batch(50, recs)
    rb = D.decode([data], 60, 1500, "t", 3, False, SCHEMA)
    assert rb.column("offset").to_pylist() == list(range(60, 1500))
    assert set(rb.column("value").to_pylist()) == {b"x" * 100}
    assert D.decode([data], 3000, 4000, "t", 3, False, SCHEMA).num_rows == 0


def test_decode_gaps_inside_a_batch_and_log_append_time():
    b = RecordBatchBuilder(base_offset=10)
    for off in (10, 13, 20):
        b.append(b"k", b"v%d" % off, timestamp=7, offset=off)
    rb = D.decode([b.build()], 11, 100, "t", 0, False, SCHEMA)
    assert rb.column("offset").to_pylist() == [13, 20]
    data = kp_batch(0, [(0, 5, None, b"a", []), (1, 6, None, b"b", [])], log_append_time=True)
    rb = D.decode([data], 0, 10, "t", 0, False, SCHEMA)
    assert rb.column("timestampType").to_pylist() == [1, 1]
    assert [t.timestamp() for t in rb.column("timestamp").to_pylist()] == [99.0, 99.0]


def test_decode_compressed_with_payload():
    recs = [(i, 5, b"k", b"value-%d" % i, []) for i in range(50)]
    data = kp_batch(0, recs, compression=1)
    payload = RecordBatch(data).records_bytes()
    rb = D.decode([data], 0, 100, "t", 0, False, SCHEMA, {0: bytes(payload)})
    assert rb.column("value").to_pylist() == [b"value-%d" % i for i in range(50)]


def test_decode_rejects_corrupt_lengths():
    data = bytearray(kp_batch(0, [(i, 5, None, b"abc", []) for i in range(4)]))
    data[61] = 0x7E           # first record claims 63 bytes
    with pytest.raises(D.CorruptBatchError):
        D.decode([bytes(data)], 0, 10, "t", 0, False, SCHEMA)


def test_records_to_batch_slow_path_same_shape():
    class Rec:
        def __init__(self, o):
            self.key, self.value, self.offset, self.timestamp = None, b"v", o, 1000
            self.timestamp_type, self.headers = 0, [("a", b"b")]
    rb = D.records_to_batch([Rec(1), Rec(2)], "t", 0, True, SCHEMA_H)
    assert rb.schema.equals(SCHEMA_H) and rb.column("headers").to_pylist()[0] == [{"key": "a", "value": b"b"}]


# ------------------------------------------------------------------------------------------ encode
KAFKA_MURMUR2 = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
                 b"a-little-bit-longer-string": -1486304829,
                 b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}


def test_murmur2_matches_kafka_and_the_client():
    keys = list(KAFKA_MURMUR2) + [b"", b"x", bytes(range(200))]
    got = E.murmur2(pa.array(keys + [None], pa.binary())).tolist()
    assert got[:len(KAFKA_MURMUR2)] == list(KAFKA_MURMUR2.values())
    assert got[:-1] == [client_murmur2(k) for k in keys]


@pytest.mark.parametrize("seed", range(4))
def test_encode_read_back_by_kafka_python(seed):
    rng = random.Random(seed)
    recs = random_records(rng, 3000)
    n = len(recs)
    keys = pa.array([r[2] for r in recs], pa.binary())
    values = pa.array([r[3] for r in recs], pa.binary())
    headers = pa.array([[{"key": k, "value": v} for k, v in r[4]] or None for r in recs], HEADERS)
    codes = np.array([rng.randrange(2) for _ in range(n)], np.int32)
    parts = np.array([rng.randrange(3) for _ in range(n)], np.int32)
    batches = E.encode(["x", "y"], codes, parts, keys, values, headers, 4242, 16384)
    got: dict = {}
    for b in batches:
        assert len(b.data) <= 16384 or b.records == 1
        kb = DefaultRecordBatch(bytearray(b.data))
        assert kb.validate_crc()
        for r in kb:
            got.setdefault((b.topic, b.partition), []).append(
                (r.key, r.value, [(k, v) for k, v in r.headers], r.timestamp))
    want: dict = {}
    for i, (_, _, k, v, h) in enumerate(recs):
        want.setdefault((["x", "y"][codes[i]], int(parts[i])), []).append((k, v, h, 4242))
    assert got == want


def test_encode_then_decode_large_fixed_records():
    n = 20_000
    values = pa.array([b"%0100d" % i for i in range(n)], pa.binary())
    batches = E.encode(["t"], np.zeros(n, np.int32), np.zeros(n, np.int32), pa.nulls(n, pa.binary()), values, None,
                       1, 1 << 20)
    assert all(len(b.data) <= 1 << 20 for b in batches)
    datas, base = [], 0
    for b in batches:
        d = bytearray(b.data)
        d[0:8] = base.to_bytes(8, "big")
        datas.append(bytes(d))
        base += b.records
    rb = D.decode(datas, 0, n, "t", 0, False, SCHEMA)
    assert rb.column("value").to_pylist() == values.to_pylist()
    assert rb.column("offset").to_pylist() == list(range(n))


def test_normalize_checks_like_spark():
    with pytest.raises(E.EncodeError, match="value"):
        E.normalize(pa.record_batch({"key": pa.array([b"k"])}), "t")
    with pytest.raises(E.EncodeError, match="topic option required"):
        E.normalize(pa.record_batch({"value": pa.array([b"v"])}), None)
    with pytest.raises(E.EncodeError, match="null topic"):
        E.normalize(pa.record_batch({"value": pa.array([b"v"]), "topic": pa.array([None], pa.string())}), None)
    topic, key, value, headers, partition = E.normalize(
        pa.record_batch({"value": pa.array(["s"]), "key": pa.array(["k"])}), "t")
    assert topic is None and value.type == pa.binary() and key.to_pylist() == [b"k"]
