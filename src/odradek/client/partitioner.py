"""Which partition a record goes to: the Java client's default partitioner.

Seed 004, "Partitioning Strategies": a keyed record goes where a hash of its key says, so every client
using the same hash agrees (semantic partitioning); a record without a key only needs load balancing.

- Keyed records: `toPositive(murmur2(key)) % numPartitions`, exactly Kafka's `Utils.murmur2` (seed
  0x9747b28c, MurmurHash2 by Austin Appleby) and `Utils.toPositive` (`n & 0x7fffffff`), over all of
  the topic's partitions, available or not. librdkafka's `murmur2` and `murmur2_random` partitioners
  compute the same, so keys land where the Java client and confluent-kafka put them. An empty key is a
  key (it hashes); only `None` is keyless.
- Keyless records: sticky partitioning (KIP-480). All keyless records of a topic go to one partition
  until a batch for it is closed (`on_new_batch`), then another partition is picked at random among
  those with a leader, never the same one twice in a row when there is a choice. Batches fill up, so
  fewer, larger requests, instead of one small batch per partition.
"""

from __future__ import annotations

import functools
import random
import struct
from typing import Callable, Sequence

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit hash of the bytes."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length >> 2
    if n4:
        for k in struct.unpack_from(f"<{n4}I", data):
            k = (k * _M) & _MASK
            k ^= k >> 24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        base = length & ~3
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's `Utils.toPositive`: clear the sign bit (not abs(), which differs for MIN_VALUE)."""
    return n & 0x7FFFFFFF


@functools.lru_cache(maxsize=4096)
def _key_hash(key: bytes) -> int:
    return to_positive(murmur2(key))


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition of a keyed record; the hashes of recent short keys are remembered (a key is
    usually sent many times, and murmur2 in Python costs more than the rest of a send)."""
    if type(key) is bytes and len(key) <= 256:
        return _key_hash(key) % num_partitions
    return to_positive(murmur2(key)) % num_partitions


# partitioner(topic, key, num_partitions, available_partitions) -> partition
PartitionerFn = Callable[[str, bytes | None, int, Sequence[int]], int]


class DefaultPartitioner:
    """murmur2 for keys, sticky for keyless records (KIP-480)."""

    def __init__(self, *, ignore_keys: bool = False, rng: random.Random | None = None) -> None:
        self.ignore_keys = ignore_keys
        self.rng = rng or random.Random()
        self.sticky: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, num_partitions: int,
                  available: Sequence[int]) -> int:
        if key is not None and not self.ignore_keys:
            return partition_for_key(key, num_partitions)
        p = self.sticky.get(topic)
        if p is None or p >= num_partitions:
            p = self._next(topic, -1, num_partitions, available)
        return p

    def on_new_batch(self, topic: str, prev_partition: int, num_partitions: int,
                     available: Sequence[int]) -> None:
        """The sticky partition's batch closed: move on, if records were sticking to it."""
        if self.sticky.get(topic) == prev_partition:
            self._next(topic, prev_partition, num_partitions, available)

    def _next(self, topic: str, prev: int, num_partitions: int, available: Sequence[int]) -> int:
        choices = [p for p in available if p != prev] or list(available) or \
            [p for p in range(num_partitions) if p != prev] or [0]
        p = choices[self.rng.randrange(len(choices))] if len(choices) > 1 else choices[0]
        self.sticky[topic] = p
        return p
