import pytest

from odradek.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache
from odradek.storage.errors import StorageError


def cache_with(tmp_path, *entries) -> LeaderEpochCache:
    cache = LeaderEpochCache.load(tmp_path)
    for epoch, offset in entries:
        cache.assign(epoch, offset)
    return cache


def test_file_format_and_reload(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 120), (4, 500))
    assert (tmp_path / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n3\n1 0\n3 120\n4 500\n"
    assert LeaderEpochCache.load(tmp_path).entries() == [(1, 0), (3, 120), (4, 500)]
    assert not (tmp_path / (LEADER_EPOCH_CHECKPOINT + ".tmp")).exists()


def test_assign_ignores_repeats_and_drops_contradicted_entries(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (1, 10), (2, 20))
    assert cache.entries() == [(1, 0), (2, 20)]
    cache.assign(2, 15)  # same epoch, earlier start: replaces
    assert cache.entries() == [(1, 0), (2, 15)]
    cache.assign(3, 12)  # starts before epoch 2 did: epoch 2 is gone
    assert cache.entries() == [(1, 0), (3, 12)]
    with pytest.raises(ValueError):
        cache.assign(-1, 0)


def test_end_offset_for_epoch(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 120), (4, 500))
    leo = 900
    assert cache.end_offset_for(4, leo) == (4, 900)  # latest epoch: the log end offset
    assert cache.end_offset_for(3, leo) == (3, 500)
    assert cache.end_offset_for(2, leo) == (1, 120)  # unknown epoch in between: previous one
    assert cache.end_offset_for(1, leo) == (1, 120)
    assert cache.end_offset_for(0, leo) == (0, 0)  # older than any: first known start
    assert cache.end_offset_for(7, leo) == (-1, -1)
    assert cache.end_offset_for(-1, leo) == (-1, -1)


def test_empty_cache(tmp_path):
    cache = LeaderEpochCache.load(tmp_path)
    assert cache.latest_epoch is None
    assert cache.end_offset_for(0, 10) == (-1, -1)
    assert cache.epoch_for_offset(5) is None


def test_epoch_for_offset(tmp_path):
    cache = cache_with(tmp_path, (1, 10), (3, 120))
    assert cache.epoch_for_offset(9) is None
    assert cache.epoch_for_offset(10) == 1
    assert cache.epoch_for_offset(119) == 1
    assert cache.epoch_for_offset(120) == 3
    assert cache.epoch_for_offset(10**9) == 3


def test_truncation_from_end_and_start(tmp_path):
    cache = cache_with(tmp_path, (1, 0), (3, 120), (4, 500))
    cache.truncate_from_end(500)
    assert cache.entries() == [(1, 0), (3, 120)]
    cache.truncate_from_start(130)
    assert cache.entries() == [(3, 130)]
    cache.truncate_from_start(50)  # never backwards
    assert cache.entries() == [(3, 130)]
    assert LeaderEpochCache.load(tmp_path).entries() == [(3, 130)]
    cache.clear()
    assert LeaderEpochCache.load(tmp_path).entries() == []


def test_malformed_file_is_an_error(tmp_path):
    (tmp_path / LEADER_EPOCH_CHECKPOINT).write_text("0\n2\n1 0\n")
    with pytest.raises(StorageError):
        LeaderEpochCache.load(tmp_path)
    (tmp_path / LEADER_EPOCH_CHECKPOINT).write_text("0\n2\n3 0\n1 5\n")
    with pytest.raises(StorageError):
        LeaderEpochCache.load(tmp_path)
