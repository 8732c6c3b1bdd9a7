"""The per-record scan (`records.scan`): both implementations (the plain loop and the vectorised one)
give the same answer on real batches, built by kafka-python (the oracle) and by us, with every codec,
and refuse every kind of lying record with the same record index.

Records with a lie are assembled by hand (`lying_batches.rec`), so any field can be given any value.
"""

from __future__ import annotations

import os
import random

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from odradek.records import GZIP, LZ4, NONE, SNAPPY, ZSTD, RecordBatch, RecordBatchBuilder
from odradek.records.scan import (
    KEY_ERROR, TIMESTAMP_ERROR, VECTOR_MIN_RECORDS, InvalidRecordError, RecordRules, delta_bounds,
    scan_records, scan_records_loop,
)
from odradek.records.scan_vector import CHUNK_RECORDS, scan_records_vector

from .lying_batches import rec, v

CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
BASE = 1_700_000_000_000


class Refused(Exception):
    def __init__(self, index: int | None, messages: list[str]) -> None:
        super().__init__(" / ".join(messages))
        self.index = index
        self.messages = messages


def both(data, count: int, base: int = BASE, rules: RecordRules = RecordRules()):
    """Scan with both implementations; return the common result, or raise Refused when both refuse
    the same record (their wording may differ)."""
    bounds = delta_bounds(base, rules)
    outcomes = []
    for scan in (scan_records_loop, scan_records_vector):
        try:
            r = scan(memoryview(bytes(data)), count, bounds)
            outcomes.append(("ok", r.count, r.max_timestamp_delta, r.errors, r.error_count))
        except InvalidRecordError as e:
            outcomes.append(("error", e.index, str(e)))
    assert outcomes[0][:2] == outcomes[1][:2], outcomes
    if outcomes[0][0] == "error":
        raise Refused(outcomes[0][1], [o[2] for o in outcomes])
    assert outcomes[0] == outcomes[1], outcomes
    return outcomes[0]


def refused(data, count: int, words: str = "", **kw) -> Refused:
    """Both implementations refuse, each saying `words`."""
    with pytest.raises(Refused) as e:
        both(data, count, **kw)
    assert all(words in m for m in e.value.messages), e.value.messages
    return e.value


def section(data: bytes) -> bytes:
    """A batch's records section, decompressed."""
    return bytes(RecordBatch(data).records_bytes())


# ------------------------------------------------------------------------------------------ real batches
@pytest.mark.parametrize("codec", CODECS)
def test_batches_built_by_kafka_python(codec):
    rng = random.Random(codec)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 30)
    rows = []
    for i in range(300):
        key = None if i % 7 == 0 else os.urandom(rng.randrange(0, 20))
        value = None if i % 11 == 0 else os.urandom(rng.choice([0, 5, 100, 3000]))
        headers = [(f"h{j}", None if j == 1 else b"x" * j) for j in range(rng.randrange(0, 4))]
        ts = BASE + rng.randrange(-5000, 5000)
        builder.append(i, ts, key, value, headers)
        rows.append((key, ts))
    data = bytes(builder.build())
    theirs = DefaultRecordBatch(bytearray(data))
    ours = RecordBatch(data)
    result = both(section(data), ours.records_count, ours.base_timestamp,
                  RecordRules(BASE - 4000, BASE + 4000, keys_required=True))
    _, count, max_delta, errors, error_count = result
    assert count == theirs.records_count == 300
    assert ours.base_timestamp + max_delta == theirs.max_timestamp == max(ts for _, ts in rows)
    expected = [(i, KEY_ERROR if key is None else TIMESTAMP_ERROR) for i, (key, ts) in enumerate(rows)
                if key is None or not BASE - 4000 <= ts <= BASE + 4000]
    assert errors == expected and error_count == len(expected)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("shape", ["uniform", "varied", "headers", "big", "far timestamps"])
def test_batches_built_by_us(codec, shape):
    rng = random.Random(shape)
    builder = RecordBatchBuilder(compression=codec)
    n = {"big": 3, "uniform": 5000}.get(shape, 700)
    for i in range(n):
        size = {"uniform": 100, "big": (1 << 20) + 10}.get(shape, rng.randrange(0, 300))
        headers = [("k", b"v" * rng.randrange(3))] * rng.randrange(0, 40) if shape == "headers" else ()
        ts = BASE + (rng.randrange(-10**12, 10**12) if shape == "far timestamps" else i)
        builder.append(b"key", os.urandom(size), headers=headers, timestamp=ts)
    data = builder.build()
    batch = RecordBatch(data)
    _, count, max_delta, errors, _ = both(section(data), batch.records_count, batch.base_timestamp)
    assert count == n and errors == []
    assert batch.base_timestamp + max_delta == batch.max_timestamp


def test_dispatch_by_size_gives_the_same_result():
    for n in (1, VECTOR_MIN_RECORDS - 1, VECTOR_MIN_RECORDS, 500):
        data = b"".join(rec(i, ts=i) for i in range(n))
        r = scan_records(data, n, BASE)
        assert (r.count, r.max_timestamp_delta) == (n, n - 1)


def test_chunks_of_a_huge_batch_and_an_error_past_the_first_chunk():
    n = CHUNK_RECORDS * 2 + 17
    records = [rec(i, key=None, value=b"") for i in range(n)]
    _, count, _, errors, error_count = both(b"".join(records), n,
                                            rules=RecordRules(keys_required=True, max_errors=5))
    assert count == n and errors == [(i, KEY_ERROR) for i in range(5)] and error_count == n
    records[CHUNK_RECORDS + 3] = rec(CHUNK_RECORDS + 3, key=None, value=b"", offset=7)
    assert refused(b"".join(records), n).index == CHUNK_RECORDS + 3


def test_runs_of_uniform_and_varied_records_frame_right():
    rng = random.Random(7)
    records = []
    for run in range(40):
        size = rng.randrange(0, 200)
        for _ in range(rng.choice([1, 2, 30, 300])):
            i = len(records)
            records.append(rec(i, value=b"x" * (size if run % 2 else rng.randrange(0, 200))))
    _, count, _, _, _ = both(b"".join(records), len(records))
    assert count == len(records)


# ------------------------------------------------------------------------------------------ lies
def test_count_larger_than_the_records():
    refused(rec(0), 5, "declares 5 records")
    refused(b"".join(rec(i) for i in range(60)), 61, "holds 60")


def test_count_smaller_than_the_records():
    refused(b"".join(rec(i) for i in range(3)), 1, "left over")
    refused(b"".join(rec(i) for i in range(70)), 60, "left over")


@pytest.mark.parametrize("n", [3, 80])
@pytest.mark.parametrize("lie, kw, words", [
    ("record length past the batch", {"length": 10_000}, "length 10000"),
    ("record length below the smallest record", {"length": 3}, "length 3"),
    ("record length negative", {"length": -2}, "length -2"),
    ("key length past the record", {"key_length": 50}, "key length 50 runs past"),
    ("key length below -1", {"key_length": -2}, "key length -2 is negative"),
    ("value length past the record", {"value_length": 99}, "value length 99 runs past"),
    ("header count negative", {"header_count": -1}, "header count -1"),
    ("header count past the record", {"header_count": 30}, "header count 30"),
    ("header key length negative", {"headers": [(b"a", b"b")], "tail": b""}, None),
    ("offset delta out of order", {"offset": 0}, "offset delta 0, expected"),
    ("bytes left inside the record", {"tail": b"\x00\x00"}, "but its fields take"),
])
def test_every_lie_is_refused_at_its_record(n, lie, kw, words):
    bad = n - 2
    records = [rec(i) for i in range(n)]
    if lie == "header key length negative":
        body = b"\x00\x00" + v(bad) + v(1) + b"k" + v(1) + b"v" + v(1) + v(-1) + v(-1)
        records[bad] = v(len(body)) + body
        words = "header key length -1 is negative"
    else:
        records[bad] = rec(bad, **kw)
    assert refused(b"".join(records), n, words).index == bad


def test_header_value_past_the_record_in_the_vector_and_loop_header_paths():
    # Many records with headers (vectorised header decode) and one with many (the loop's part).
    def lying(i: int, headers: int) -> bytes:
        body = b"\x00\x00" + v(i) + v(1) + b"k" + v(1) + b"v" + v(headers)
        body += (v(1) + b"h" + v(1) + b"v") * (headers - 1) + v(1) + b"h" + v(40) + b"short"
        return v(len(body)) + body

    records = [rec(i, headers=[(b"h", b"v")] * (2 if i < 60 else 30)) for i in range(64)]
    records[62] = lying(62, 30)
    assert refused(b"".join(records), 64, "header value length 40 runs past").index == 62
    records[62] = rec(62, headers=[(b"h", b"v")] * 30)
    records[5] = lying(5, 2)
    assert refused(b"".join(records), 64, "header value length 40 runs past").index == 5


@pytest.mark.parametrize("n", [2, 100])
def test_malformed_varints(n):
    records = [rec(i) for i in range(n)]
    records[1] = v(12) + b"\x00" + b"\xff" * 11  # a timestamp delta longer than 10 bytes
    assert refused(b"".join(records), n, "longer than 10 bytes").index == 1
    records[1] = v(8) + b"\x00\x00" + b"\xff\xff\xff\xff\x7f" + b"\x00"  # offset delta past 32 bits
    assert refused(b"".join(records), n, "32 bits").index == 1


def test_truncated_length_varint_at_the_end():
    records = b"".join(rec(i) for i in range(60)) + b"\xff"
    assert refused(records, 61, "truncated").index == 60


# ------------------------------------------------------------------------------------------ record errors
def test_null_keys_and_timestamps_are_listed_not_raised():
    rows = [rec(i, key=None if i in (3, 50) else b"k", ts=(10**9 if i in (7, 50, 51) else i)) for i in range(60)]
    rules = RecordRules(BASE - 10, BASE + 1000, keys_required=True)
    _, count, max_delta, errors, n = both(b"".join(rows), 60, BASE, rules)
    assert count == 60 and max_delta == 10**9
    assert errors == [(3, KEY_ERROR), (7, TIMESTAMP_ERROR), (50, KEY_ERROR), (51, TIMESTAMP_ERROR)] and n == 4


def test_no_timestamp_is_not_range_checked():
    rows = [rec(i, ts=0) for i in range(50)]  # base -1 and delta 0: NO_TIMESTAMP
    _, _, _, errors, _ = both(b"".join(rows), 50, -1, RecordRules(BASE - 10, BASE + 10))
    assert errors == []
    _, _, _, errors, _ = both(b"".join(rows), 50, 5, RecordRules(BASE - 10, BASE + 10))
    assert errors == [(i, TIMESTAMP_ERROR) for i in range(50)]


def test_error_listing_is_bounded():
    rows = [rec(i, key=None) for i in range(100)]
    _, _, _, errors, n = both(b"".join(rows), 100, rules=RecordRules(keys_required=True, max_errors=7))
    assert errors == [(i, KEY_ERROR) for i in range(7)] and n == 100


def test_random_batches_and_random_damage_get_the_same_answer_from_both():
    """Differential check: equal-size runs, varied sizes, headers, null keys and wide deltas, each
    then damaged at random bytes; the loop and the vectorised scan must agree on every one."""
    rng = random.Random(467)
    rules = RecordRules(BASE - 1000, BASE + 10**7, keys_required=True, max_errors=50)
    for case in range(250):
        n = rng.choice([48, 64, 65, 100, 300, 1000])
        size = rng.randrange(0, 150)
        rows = []
        for i in range(n):
            varied = rng.random() < (0.05 if case % 2 else 0.6)
            value = b"x" * (rng.randrange(0, 300) if varied else size)
            key = None if rng.random() < 0.02 else b"key"
            headers = [(b"h", b"v")] if rng.random() < (0.3 if case % 5 == 0 else 0.0) else None
            ts = rng.choice([i, i * 1000, -5, 2 * 10**7, 1 << 40]) if case % 3 == 0 else i // 10
            rows.append(rec(i, key, value, headers=headers, ts=ts))
        data = bytearray(b"".join(rows))
        both(bytes(data), n, rules=rules)
        for _ in range(3):
            damaged = bytearray(data)
            for _ in range(rng.choice([1, 1, 2, 5])):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            try:
                both(bytes(damaged), n, rules=rules)
            except Refused:
                pass
