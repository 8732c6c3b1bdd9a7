import os

from odradek.storage.recovery import recover_segment
from odradek.storage.segment import LogSegment
from tests.unit.storage.batches import batch, split


def make_segment(tmp_path, base_offset=0, interval=200, index_bytes=1024 * 1024):
    return LogSegment.create(tmp_path, base_offset, index_interval_bytes=interval,
                             max_index_bytes=index_bytes, now_ms=0)


def fill(segment, count, *, first_offset=None, records=2, size=150, ts0=1_000):
    """Append `count` batches of `records` records each, one append per batch."""
    offset = segment.next_offset if first_offset is None else first_offset
    for i in range(count):
        raw = batch([bytes([i % 256]) * (size - 80)] * records, base_offset=offset,
                    base_timestamp=ts0 + 10 * i, timestamp_deltas=list(range(records)))
        segment.append(memoryview(bytearray(raw)))
        offset += records
    return offset


def test_names_and_append_read_round_trip(tmp_path):
    segment = make_segment(tmp_path, 42)
    assert segment.log_path.name == "00000000000000000042.log"
    assert (tmp_path / "00000000000000000042.index").exists()
    assert (tmp_path / "00000000000000000042.timeindex").exists()
    end = fill(segment, 30, first_offset=42)
    assert segment.next_offset == end == 102
    assert os.path.getsize(segment.log_path) == segment.size
    piece = segment.read(42, 10**9)
    data = piece.read()
    assert len(data) == segment.size
    headers = split(data)
    assert [h["base_offset"] for h in headers] == list(range(42, 102, 2))
    assert all(h["crc_ok"] for h in headers)


def test_sparse_index_every_interval(tmp_path):
    segment = make_segment(tmp_path, interval=400)
    fill(segment, 40, size=150)
    entries = segment.offset_index.entries
    assert 10 <= entries <= 20  # one per ~400 bytes of 150-byte batches
    positions = [segment.offset_index.entry(i)[1] for i in range(entries)]
    headers = {h["base_offset"]: h for h in split(segment.read(0, 10**9).read())}
    starts, pos = set(), 0
    for h in headers.values():
        starts.add(pos)
        pos += h["size"]
    assert set(positions) <= starts  # every entry points at a batch start


def test_find_batch_and_read_from_the_middle_of_a_batch(tmp_path):
    segment = make_segment(tmp_path)
    fill(segment, 50, records=3)
    for target in (0, 1, 2, 3, 77, 149):
        b = segment.find_batch(target)
        assert b.base_offset <= target <= b.last_offset
        assert split(segment.read(target, 1).read())[0]["base_offset"] == b.base_offset
    assert segment.find_batch(150) is None
    assert segment.read(150, 1000) is None


def test_read_whole_batches_only(tmp_path):
    segment = make_segment(tmp_path)
    fill(segment, 40, size=150)
    for max_bytes in range(0, 2_000, 37):
        piece = segment.read(10, max_bytes)
        data = piece.read()
        headers = split(data)  # asserts no partial batch
        assert headers[0]["base_offset"] == 10
        if max_bytes >= headers[0]["size"]:
            assert len(data) <= max_bytes
        else:
            assert len(headers) == 1  # min_one_batch: one whole batch even if larger
        assert segment.read(10, max_bytes, min_one_batch=False).length <= max_bytes


def test_read_stops_before_max_offset(tmp_path):
    segment = make_segment(tmp_path)
    fill(segment, 20)  # offsets 0..39, two per batch
    headers = split(segment.read(0, 10**9, max_offset=10).read())
    assert headers[-1]["last_offset"] == 9
    assert segment.read(10, 10**9, max_offset=10).length == 0
    # a batch straddling max_offset (offsets 10-11, max 11) is not served
    assert split(segment.read(0, 10**9, max_offset=11).read())[-1]["last_offset"] == 9


def test_find_offset_by_timestamp_is_record_exact(tmp_path):
    segment = make_segment(tmp_path, interval=100)
    fill(segment, 20, records=3, ts0=1_000)  # batch i: timestamps 1000+10i, +1, +2
    assert segment.find_offset_by_timestamp(0, 0) == (1_000, 0)
    assert segment.find_offset_by_timestamp(1_051, 0) == (1_051, 16)
    assert segment.find_offset_by_timestamp(1_053, 0) == (1_060, 18)
    assert segment.find_offset_by_timestamp(1_052, 17) == (1_052, 17)
    assert segment.find_offset_by_timestamp(1_052, 18) == (1_060, 18)
    assert segment.find_offset_by_timestamp(10_000, 0) is None
    assert segment.max_timestamp == 1_192
    assert segment.offset_of_max_timestamp == 59


def test_truncate_to_and_reopen(tmp_path):
    segment = make_segment(tmp_path, interval=100)
    fill(segment, 30)  # offsets 0..59
    segment.truncate_to(31)  # removes the batch holding 30-31 and everything after
    assert segment.next_offset == 30
    assert split(segment.read(0, 10**9).read())[-1]["last_offset"] == 29
    assert segment.max_timestamp == 1_000 + 10 * 14 + 1
    segment.close()
    again = LogSegment.open(tmp_path, 0, index_interval_bytes=100, max_index_bytes=1 << 20,
                            now_ms=0)
    again.check_indexes()
    assert again.next_offset == 30
    assert again.max_timestamp == 1_141
    assert fill(again, 1) == 32


def test_recover_segment_cuts_garbage_and_rebuilds_indexes(tmp_path):
    segment = make_segment(tmp_path, interval=100)
    fill(segment, 20)
    good_size = segment.size
    entries = segment.offset_index.entries
    with open(segment.log_path, "ab") as f:
        f.write(b"\x00\x01garbage" * 50)
    assert recover_segment(segment) == 9 * 50
    assert segment.size == good_size == os.path.getsize(segment.log_path)
    assert segment.offset_index.entries == entries
    assert segment.next_offset == 40


def _scanned(segment, offset):
    """find_batch the slow way: from the offset index and the file's own headers."""
    _, position = segment.offset_index.lookup(offset)
    return next((b for b in segment.batches(position) if b.last_offset >= offset), None)


def test_reads_at_the_log_end_find_the_latest_batches_without_reading_the_file(tmp_path, monkeypatch):
    segment = make_segment(tmp_path)
    end = fill(segment, 200, records=3)
    scanned = {o: _scanned(segment, o) for o in range(end - 150, end + 2)}

    def no_file_reads(*args, **kwargs):
        raise AssertionError("read the file's headers")
    monkeypatch.setattr(segment, "batches", no_file_reads)
    for offset, expected in scanned.items():
        assert segment.find_batch(offset) == expected
    piece = segment.read(end - 3, 10**9, end)
    assert (piece.position, piece.length) == (scanned[end - 3].position, scanned[end - 3].size)


def test_the_latest_batches_are_forgotten_when_the_file_is_cut_or_rebuilt(tmp_path):
    segment = make_segment(tmp_path)
    end = fill(segment, 40, records=2)
    segment.truncate_to(end - 20)
    assert segment.find_batch(end - 20) is None
    assert segment.find_batch(end - 22) == _scanned(segment, end - 22)
    end = fill(segment, 5, records=4, size=300)    # different batches over the cut bytes
    for offset in range(end - 40, end + 1):
        assert segment.find_batch(offset) == _scanned(segment, offset)
    recover_segment(segment)
    for offset in range(0, end + 1):
        assert segment.find_batch(offset) == _scanned(segment, offset)


def test_a_long_run_of_appends_keeps_a_bounded_tail_that_agrees_with_the_file(tmp_path):
    from odradek.storage.segment import RECENT_BATCHES
    segment = make_segment(tmp_path)
    end = fill(segment, 5 * RECENT_BATCHES, records=1)
    assert RECENT_BATCHES <= len(segment._recent) <= 2 * RECENT_BATCHES
    for offset in range(0, end + 1):
        assert segment.find_batch(offset) == _scanned(segment, offset)
