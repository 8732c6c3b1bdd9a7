"""murmur2 against Kafka's test vectors (UtilsTest.testMurmur2) and the sticky partitioner (KIP-480)."""

from __future__ import annotations

import random

import pytest

from odradek.client.partitioner import DefaultPartitioner, murmur2, partition_for_key, to_positive

# org.apache.kafka.common.utils.UtilsTest#testMurmur2
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
]


@pytest.mark.parametrize("key,expected", KAFKA_VECTORS)
def test_murmur2_kafka_vectors(key, expected):
    assert murmur2(key) == expected


def test_murmur2_every_tail_length_and_bytearray():
    for n in range(0, 9):
        data = bytes(range(200, 200 + n))
        assert murmur2(bytearray(data)) == murmur2(data)
        assert -2**31 <= murmur2(data) < 2**31


def test_to_positive_is_a_mask_not_abs():
    assert to_positive(-2**31) == 0
    assert to_positive(-1) == 2**31 - 1
    assert to_positive(5) == 5


def test_keyed_partition_uses_all_partitions_even_unavailable():
    p = DefaultPartitioner()
    for key, h in KAFKA_VECTORS:
        assert p.partition("t", key, 6, available=[0]) == (h & 0x7FFFFFFF) % 6 == partition_for_key(key, 6)


def test_empty_key_is_hashed_not_sticky():
    p = DefaultPartitioner()
    assert p.partition("t", b"", 7, range(7)) == partition_for_key(b"", 7)


def test_sticky_keyless_until_new_batch_then_moves_to_another_available_partition():
    p = DefaultPartitioner(rng=random.Random(7))
    first = p.partition("t", None, 6, [0, 1, 2, 3, 4, 5])
    assert all(p.partition("t", None, 6, [0, 1, 2, 3, 4, 5]) == first for _ in range(100))
    seen = {first}
    prev = first
    for _ in range(50):
        p.on_new_batch("t", prev, 6, [0, 1, 2, 3, 4, 5])
        nxt = p.partition("t", None, 6, [0, 1, 2, 3, 4, 5])
        assert nxt != prev
        seen.add(nxt)
        prev = nxt
    assert seen == set(range(6))
    # a new batch on a partition that is not the sticky one does not move it
    p.on_new_batch("t", (prev + 1) % 6, 6, range(6))
    assert p.partition("t", None, 6, range(6)) == prev


def test_sticky_prefers_available_partitions():
    p = DefaultPartitioner(rng=random.Random(1))
    for _ in range(20):
        p.on_new_batch("t", p.partition("t", None, 6, [2, 4]), 6, [2, 4])
        assert p.partition("t", None, 6, [2, 4]) in (2, 4)


def test_ignore_keys():
    p = DefaultPartitioner(ignore_keys=True, rng=random.Random(3))
    assert len({p.partition("t", f"k{i}".encode(), 6, range(6)) for i in range(50)}) == 1
