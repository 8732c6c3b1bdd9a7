"""The cleaner's record-level rules: the offset map, record scanning, and recopying one batch."""

import struct

import pytest
from crc32c import crc32c

from odradek.records import COMMIT, EndTransactionMarker, RecordBatch, RecordBatchBuilder, \
    build_end_txn_marker_batch, codecs
from odradek.records.header import DELETE_HORIZON_MASK, BatchHeader
from odradek.storage.cleaner_records import ENTRY_OVERHEAD_BYTES, FilterContext, \
    MalformedRecords, OffsetMap, filter_batch, map_batch, map_key, scan_records

DAY = 86_400_000


def build(records, *, base_offset=100, compression=codecs.NONE, producer=(-1, -1, -1),
          log_append_time=None, transactional=False, partition_leader_epoch=7,
          last_offset_delta=None) -> bytes:
    """records: (offset, timestamp, key, value[, headers])."""
    pid, epoch, seq = producer
    b = RecordBatchBuilder(compression=compression, base_offset=base_offset, producer_id=pid,
                           producer_epoch=epoch, base_sequence=seq, is_transactional=transactional,
                           partition_leader_epoch=partition_leader_epoch,
                           timestamp_type=0 if log_append_time is None else 1,
                           log_append_time=log_append_time)
    for offset, ts, key, value, *headers in records:
        b.append(key, value, timestamp=ts, offset=offset, headers=headers[0] if headers else ())
    return bytes(b.build(last_offset_delta=last_offset_delta))


def decoded(batch: bytes):
    h = RecordBatch(batch, 0)
    h.ensure_valid()
    return h, [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in h.records()]


def context(mapping: dict, latest: int, now_ms=1_000_000, producers=None, upper=10**9,
            retention=DAY) -> FilterContext:
    m = OffsetMap(1 << 20)
    for key, offset in mapping.items():
        m.put(map_key(key), offset)
    m.latest_offset = latest
    return FilterContext(m, now_ms, retention, producers or {}, upper)


# ---- the map ------------------------------------------------------------------------------------

def test_offset_map_charges_each_new_key_and_refuses_past_its_budget():
    m = OffsetMap(3 * (ENTRY_OVERHEAD_BYTES + 2))
    assert m.put(b"k1", 1) and m.put(b"k2", 2) and m.put(b"k3", 3)
    assert m.put(b"k1", 10)                   # an update costs nothing
    assert not m.put(b"k4", 4)                # full: refused, nothing changed
    assert m.get(b"k4") == -1 and len(m) == 3 and m.get(b"k1") == 10
    assert m.put(b"k4", 4, force=True)        # the first batch of a pass goes in regardless
    assert m.utilization > 1.0


def test_long_keys_are_mapped_by_digest_short_ones_as_they_are():
    assert map_key(b"short") == b"short"
    long_a, long_b = b"a" * 40, b"a" * 39 + b"b"
    assert len(map_key(long_a)) == 16 and map_key(long_a) != map_key(long_b)
    assert map_key(b"x" * 15) == b"x" * 15


# ---- scanning -----------------------------------------------------------------------------------

def test_scan_records_reads_offsets_keys_tombstones_and_multibyte_varints():
    records = [(100, 5_000, b"k" * 300, b"v" * 70_000), (101, 4_000, None, b"x"),
               (140, 10**12, b"t", None, [("h", b"1")]), (200, 5_000, b"", b"")]
    batch = build(records)
    body = batch[61:]
    scanned = scan_records(body, 4)
    base_ts = 5_000
    assert [(base_ts + ts, 100 + od, key, has_value) for _s, _e, ts, od, key, has_value in scanned] \
        == [(5_000, 100, b"k" * 300, True), (4_000, 101, None, True), (10**12, 140, b"t", False),
            (5_000, 200, b"", True)]
    assert scanned[0][0] == 0 and scanned[-1][1] == len(body)


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_scan_records_refuses_truncated_records(cut):
    body = build([(100, 1, b"key", b"value" * 10)])[61:]
    with pytest.raises(MalformedRecords):
        scan_records(body[:-cut], 1)
    with pytest.raises(MalformedRecords):
        scan_records(body + b"\x00", 1)


# ---- mapping ------------------------------------------------------------------------------------

def test_map_batch_maps_keys_at_or_after_the_start_and_moves_the_latest_offset():
    m = OffsetMap(1 << 20)
    m.clear(latest_offset=101)
    full, read = map_batch(build([(100, 1, b"a", b"1"), (102, 1, b"b", b"2"), (104, 1, b"a", b"3"),
                                  (105, 1, None, b"4")], last_offset_delta=6), m, 102, False)
    assert (full, read) == (False, 4)
    assert m.get(b"a") == 104 and m.get(b"b") == 102 and len(m) == 2
    assert m.latest_offset == 106


def test_map_batch_stops_when_full_and_keeps_the_latest_offset_of_the_last_whole_batch():
    m = OffsetMap(2 * (ENTRY_OVERHEAD_BYTES + 1))
    m.clear(latest_offset=99)
    full, _ = map_batch(build([(100, 1, b"a", b"1"), (101, 1, b"b", b"2"), (102, 1, b"c", b"3")]),
                        m, 100, False)
    assert full and m.latest_offset == 99 and len(m) == 2


# ---- filtering ----------------------------------------------------------------------------------

def test_a_batch_whose_records_all_stay_is_copied_byte_for_byte():
    batch = build([(100, 1, b"a", b"1"), (101, 2, b"b", b"2")], compression=codecs.GZIP)
    ctx = context({b"a": 100, b"b": 101}, latest=101)
    assert filter_batch(batch, ctx) is batch
    assert (ctx.records_read, ctx.records_kept) == (2, 2)


@pytest.mark.parametrize("codec", sorted(codecs.CODEC_NAMES))
def test_recopied_batch_keeps_offsets_timestamps_producer_fields_and_compression(codec):
    records = [(100, 5_000, b"a", b"old-a", [("h", b"x")]), (101, 4_000, b"b", b"b1"),
               (103, 7_000, b"a", b"new-a"), (104, 9_000, b"c", b"c1")]
    batch = build(records, compression=codec, producer=(42, 3, 1000), last_offset_delta=5)
    ctx = context({b"a": 103, b"b": 101, b"c": 200}, latest=300)
    out = filter_batch(batch, ctx)
    h, recs = decoded(out)
    assert [r[:4] for r in recs] == [(101, 4_000, b"b", b"b1"), (103, 7_000, b"a", b"new-a")]
    assert (h.base_offset, h.last_offset_delta, h.compression) == (100, 5, codec)
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (42, 3, 1000)
    assert h.partition_leader_epoch == 7 and h.records_count == 2
    assert h.max_timestamp == 7_000 and not h.attributes & DELETE_HORIZON_MASK
    assert (ctx.records_read, ctx.records_kept) == (4, 2)


def test_records_past_the_maps_latest_offset_always_stay():
    batch = build([(100, 1, b"a", b"1"), (101, 1, b"a", b"2")])
    ctx = context({b"a": 500}, latest=100)
    _, recs = decoded(filter_batch(batch, ctx))
    assert [r[0] for r in recs] == [101]


def test_keyless_records_are_removed():
    batch = build([(100, 1, None, b"1"), (101, 1, b"a", b"2")])
    ctx = context({b"a": 101}, latest=101)
    _, recs = decoded(filter_batch(batch, ctx))
    assert [r[0] for r in recs] == [101] and ctx.keyless_removed == 1


def test_a_kept_tombstone_gets_a_delete_horizon_and_its_records_keep_their_timestamps():
    records = [(100, 5_000, b"a", b"1"), (101, 6_000, b"b", None), (102, 4_000, b"c", b"3")]
    batch = build(records)
    ctx = context({b"a": 100, b"b": 101, b"c": 102}, latest=102, now_ms=1_000_000, retention=DAY)
    first = filter_batch(batch, ctx)
    h, recs = decoded(first)
    assert h.attributes & DELETE_HORIZON_MASK
    assert h.base_timestamp == 1_000_000 + DAY            # the horizon, where the base was
    assert [r[:4] for r in recs] == [(100, 5_000, b"a", b"1"), (101, 6_000, b"b", None),
                                     (102, 4_000, b"c", b"3")]
    assert h.max_timestamp == 6_000
    assert ctx.earliest_horizon_ms == 1_000_000 + DAY
    # Cleaned again before the horizon: copied as it is, the horizon unchanged.
    before = context({b"a": 100, b"b": 101, b"c": 102}, latest=102, now_ms=1_000_000 + DAY - 1)
    assert filter_batch(first, before) is first
    assert before.earliest_horizon_ms == 1_000_000 + DAY
    # At the horizon: the tombstone goes, the other records stay with their timestamps.
    after = context({b"a": 100, b"b": 101, b"c": 102}, latest=102, now_ms=1_000_000 + DAY)
    _, recs2 = decoded(filter_batch(first, after))
    assert [r[:4] for r in recs2] == [(100, 5_000, b"a", b"1"), (102, 4_000, b"c", b"3")]
    assert after.earliest_horizon_ms is None


def test_a_log_append_time_batch_keeps_its_timestamp():
    batch = build([(100, 1, b"a", b"1"), (101, 2, b"a", b"2")], log_append_time=77_000)
    _, recs = decoded(filter_batch(batch, context({b"a": 101}, latest=101)))
    assert recs == [(101, 77_000, b"a", b"2", [])]


def test_an_emptied_batch_is_dropped_unless_it_is_a_live_producers_last():
    batch = build([(100, 1, b"a", b"1"), (101, 2, b"b", b"2")], producer=(9, 2, 50),
                  transactional=False, compression=codecs.LZ4)
    mapping = {b"a": 300, b"b": 300}
    assert filter_batch(batch, context(mapping, latest=400)) is None
    assert filter_batch(batch, context(mapping, latest=400, producers={9: (150, 2)})) is None
    out = filter_batch(batch, context(mapping, latest=400, producers={9: (101, 2)}))
    h = BatchHeader(out, 0)
    assert h.is_valid() and h.size == 61 and h.records_count == 0
    assert (h.base_offset, h.last_offset, h.producer_id, h.producer_epoch, h.base_sequence) == \
        (100, 101, 9, 2, 50)
    assert (h.compression, h.base_timestamp, h.max_timestamp) == (0, -1, 2)
    assert list(RecordBatch(out, 0).records()) == []


def test_the_batch_ending_at_the_rounds_upper_bound_stays_even_when_emptied():
    batch = build([(100, 1, b"a", b"1")], last_offset_delta=4)
    out = filter_batch(batch, context({b"a": 300}, latest=400, upper=105))
    assert BatchHeader(out, 0).last_offset == 104 and BatchHeader(out, 0).records_count == 0


def test_control_batches_stay_as_they_are():
    marker = bytes(build_end_txn_marker_batch(EndTransactionMarker(COMMIT, 0), producer_id=5,
                                              producer_epoch=1, base_offset=120, timestamp=1))
    assert filter_batch(marker, context({}, latest=500)) is marker


def test_malformed_records_are_copied_as_they_are():
    batch = bytearray(build([(100, 1, b"a", b"1")]))
    struct.pack_into(">i", batch, 57, 3)    # records_count says 3: the records do not fill it
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    ctx = context({b"a": 200}, latest=300)
    assert filter_batch(bytes(batch), ctx) == bytes(batch) and ctx.malformed_batches == 1


@pytest.mark.parametrize("seed", range(20))
def test_mapping_and_filtering_agree_with_the_plain_record_scan(seed):
    """Random batches (keys of every length or none, tombstones, long values, offset gaps, old and
    new timestamps): the fused loops give what the rules say over `scan_records`' reading."""
    import random

    rng = random.Random(seed)
    records, offset, now = [], 100, 1_000_000
    for _ in range(rng.randint(1, 60)):
        length = rng.choice((0, 3, 15, 16, 200))
        key = None if rng.random() < 0.1 else bytes(rng.randrange(256) for _ in range(length))
        value = None if rng.random() < 0.2 else b"v" * rng.choice((0, 5, 100, 20_000))
        records.append((offset, rng.randint(-10**6, 10**9), key, value))
        offset += rng.choice((1, 1, 1, 2, 300))
    batch = build(records, compression=rng.choice(sorted(codecs.CODEC_NAMES)))
    start = rng.choice([r[0] for r in records])
    m = OffsetMap(1 << 20)
    m.clear(latest_offset=start - 1)
    assert map_batch(batch, m, start, False) == (False, len(records))
    expected_map = {}
    for offset, _ts, key, _value in records:
        if key is not None and offset >= start:
            expected_map[map_key(key)] = offset
    assert m.offsets == expected_map and m.latest_offset == records[-1][0]
    m.latest_offset = rng.choice([r[0] for r in records])   # as if the map ended mid-way
    ctx = FilterContext(m, now, DAY, {}, 10**9)
    out = filter_batch(batch, ctx)
    expected = [r for r in records
                if r[0] > m.latest_offset
                or (r[2] is not None and r[0] >= m.get(map_key(r[2])))]
    got = [] if out is None else [rec[:4] for rec in decoded(out)[1]]
    assert got == [(o, ts, k, v) for o, ts, k, v in expected]
