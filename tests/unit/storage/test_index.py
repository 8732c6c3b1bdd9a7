import struct

import pytest

from odradek.storage.errors import CorruptRecordError
from odradek.storage.index import NO_TIMESTAMP, OffsetIndex, TimeIndex


def test_offset_index_file_format_and_lookup(tmp_path):
    path = tmp_path / "00000000000000000100.index"
    index = OffsetIndex(path, 100, 10 * 1024 * 1024, new=True)
    assert path.read_bytes() == b""
    for offset, position in [(105, 4200), (120, 8500), (131, 12900)]:
        index.append(offset, position)
    index.persist()
    assert path.read_bytes() == struct.pack(">iiiiii", 5, 4200, 20, 8500, 31, 12900)
    assert index.lookup(99) == (100, 0)
    assert index.lookup(104) == (100, 0)
    assert index.lookup(105) == (105, 4200)
    assert index.lookup(119) == (105, 4200)
    assert index.lookup(1000) == (131, 12900)
    assert index.lookup_by_position(8499) == (105, 4200)
    assert index.lookup_by_position(8500) == (120, 8500)
    assert index.lookup_by_position(10) == (100, 0)
    assert index.last_entry() == (131, 12900)


def test_offset_index_truncate_persist_and_reload(tmp_path):
    path = tmp_path / "x.index"
    index = OffsetIndex(path, 0, 1024, new=True)
    for i in range(1, 11):
        index.append(i * 10, i * 1000)
    index.persist()
    index.truncate_to(50)  # entries with offset >= 50 go
    assert index.entries == 4
    index.persist()
    assert path.stat().st_size == 4 * 8
    reopened = OffsetIndex(path, 0, 1024, new=False)
    assert not reopened.loaded
    assert reopened.last_entry() == (40, 4000)  # from the file's tail, without loading
    assert not reopened.loaded
    assert reopened.lookup(45) == (40, 4000)
    reopened.truncate_to_position(2000)
    assert reopened.entries == 1


def test_offset_index_unload_only_when_persisted(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", 0, 1024, new=True)
    index.append(5, 100)
    index.unload()
    assert index.loaded  # dirty entries stay
    index.persist()
    index.unload()
    assert not index.loaded
    assert index.lookup(7) == (5, 100)


def test_offset_index_full_and_rejects_non_increasing(tmp_path):
    index = OffsetIndex(tmp_path / "x.index", 0, 8 * 3, new=True)
    for i in range(3):
        index.append(i + 1, (i + 1) * 10)
    assert index.is_full
    fresh = OffsetIndex(tmp_path / "y.index", 0, 1024, new=True)
    fresh.append(5, 100)
    with pytest.raises(AssertionError):
        fresh.append(5, 200)


def test_corrupt_index_size_is_detected(tmp_path):
    path = tmp_path / "x.index"
    path.write_bytes(b"\0" * 7)
    with pytest.raises(CorruptRecordError):
        OffsetIndex(path, 0, 1024, new=False).lookup(3)


def test_time_index_format_monotonic_and_lookup(tmp_path):
    path = tmp_path / "00000000000000000010.timeindex"
    index = TimeIndex(path, 10, 1024, new=True)
    assert index.last_entry() == (NO_TIMESTAMP, 10)
    index.maybe_append(1_000, 12)
    index.maybe_append(1_000, 15)  # not larger: ignored
    index.maybe_append(900, 16)  # smaller: ignored
    index.maybe_append(2_000, 20)
    index.persist()
    assert path.read_bytes() == struct.pack(">qiqi", 1_000, 2, 2_000, 10)
    assert index.entries == 2
    assert index.lookup(999) == (NO_TIMESTAMP, 10)
    assert index.lookup(1_500) == (1_000, 12)
    assert index.lookup(5_000) == (2_000, 20)
    index.truncate_to(20)
    assert index.last_entry() == (1_000, 12)
    index.persist()
    assert path.stat().st_size == 12


def test_time_index_final_entry_may_exceed_capacity(tmp_path):
    index = TimeIndex(tmp_path / "x.timeindex", 0, 12, new=True)
    index.maybe_append(1, 1)
    assert index.is_full
    index.maybe_append(5, 3, skip_full_check=True)
    assert index.entries == 2
