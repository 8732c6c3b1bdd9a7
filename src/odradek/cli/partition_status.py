"""What `odradek topics describe` and `odradek cluster describe` say of a partition's replication,
from its Metadata (seed 003, "Replication": the leader, the replicas and the in-sync replicas), with the
names and rules of kafka-topics.sh's filters:

- under-replicated: fewer in-sync replicas than replicas (`--under-replicated-partitions`);
- offline: no leader (leader -1);
- unavailable: no leader, or a leader that is not a live broker (`--unavailable-partitions`);
- under min ISR: fewer in-sync replicas than the topic's `min.insync.replicas`, so acks=all writes
  fail with NOT_ENOUGH_REPLICAS (`--under-min-isr-partitions`);
- at min ISR: exactly `min.insync.replicas` in sync, one failure away from that (`--at-min-isr-partitions`).

Pure functions of plain values; no I/O.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

FILTERS = ("under_replicated", "unavailable", "under_min_isr", "at_min_isr")


class PartitionLike(Protocol):
    leader: int
    replicas: Sequence[int]
    isr: Sequence[int]


def under_replicated(p: PartitionLike) -> bool:
    return len(p.isr) < len(p.replicas)


def offline(p: PartitionLike) -> bool:
    return p.leader < 0


def unavailable(p: PartitionLike, live_brokers: Iterable[int]) -> bool:
    return p.leader < 0 or p.leader not in set(live_brokers)


def under_min_isr(p: PartitionLike, min_isr: int) -> bool:
    return len(p.isr) < min_isr


def at_min_isr(p: PartitionLike, min_isr: int) -> bool:
    return len(p.isr) == min_isr


def status(p: PartitionLike, live_brokers: Iterable[int], min_isr: int | None) -> dict[str, bool]:
    """Every flag of a partition, by the names of FILTERS plus `offline`."""
    out = {"under_replicated": under_replicated(p), "offline": offline(p),
           "unavailable": unavailable(p, live_brokers)}
    if min_isr is not None:
        out["under_min_isr"] = under_min_isr(p, min_isr)
        out["at_min_isr"] = at_min_isr(p, min_isr)
    return out


def selected(flags: dict[str, bool], wanted: Sequence[str]) -> bool:
    """True when no filter is asked for, or when the partition has any flag asked for (as
    kafka-topics.sh, which takes one such filter at a time, shows the partitions it names)."""
    return not wanted or any(flags.get(name, False) for name in wanted)
