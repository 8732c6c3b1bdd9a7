"""Client-side partition assignors for the classic "consumer" protocol (seed 001, client-side
assignment: the group leader runs the assignor over every member's subscription and hands each member
its share in SyncGroup). Pure functions of (partition counts, subscriptions): no I/O, no clock.

`partition.assignment.strategy` names them as the Java client does (`range`, `roundrobin`,
`cooperative-sticky`); Java's class names are accepted too, and an object with `name`,
`supports_cooperative` and `assign()` is used as given.

range and roundrobin order members and partitions exactly as Java's RangeAssignor and
RoundRobinAssignor (members sorted by group.instance.id when both have one, static members before
dynamic ones, else by member id; topics by name; partitions ascending), so a group mixing this client
with Java or librdkafka members gets the same assignment whoever leads. Java's rack-aware range
assignment (racks on both sides) is not done: partitions are assigned as without racks.

cooperative-sticky keeps every partition with its current owner where the balance allows, then, as
Java's CooperativeStickyAssignor does, withholds each partition that must change owners: the old owner
revokes it this round, and the follow-up rebalance (which the revoking member asks for) hands it to
its new owner. Its balancing is this module's own (not Java's exact algorithm): with equal
subscriptions every member ends with floor or ceil of partitions/members; with unequal ones partitions
go to the least-loaded eligible member and then move while a member has two more than one that could
take it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

from odradek.client.errors import ConfigError
from odradek.client.fetcher import TopicPartition

__all__ = ["Assignor", "CooperativeStickyAssignor", "RangeAssignor", "RoundRobinAssignor", "Subscription",
           "assignors_from_config", "member_sort_key"]


@dataclass(frozen=True)
class Subscription:
    """One member's ConsumerProtocolSubscription, plus its group.instance.id from JoinGroup."""
    topics: tuple[str, ...]
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = -1
    group_instance_id: str | None = None
    rack_id: str | None = None
    user_data: bytes | None = None


class Assignor(Protocol):
    name: str
    supports_cooperative: bool

    def assign(self, partitions_per_topic: dict[str, int],
               subscriptions: dict[str, Subscription]) -> dict[str, list[TopicPartition]]: ...


def member_sort_key(member_id: str, sub: Subscription) -> tuple:
    """Java's MemberInfo order: static members (by instance id) first, then dynamic ones by member id."""
    if sub.group_instance_id is not None:
        return (0, sub.group_instance_id, member_id)
    return (1, member_id, "")


def _sorted_members(subscriptions: dict[str, Subscription]) -> list[str]:
    return sorted(subscriptions, key=lambda m: member_sort_key(m, subscriptions[m]))


def _counts(partitions_per_topic: dict[str, int], subscriptions: dict[str, Subscription]) -> dict[str, int]:
    """Subscribed topics that exist (with partitions), as Java's assignors see them."""
    wanted = {t for s in subscriptions.values() for t in s.topics}
    return {t: n for t, n in partitions_per_topic.items() if t in wanted and n > 0}


class RangeAssignor:
    """Per topic, consecutive ranges to the subscribed members in order, the first
    (partitions % members) getting one more."""

    name = "range"
    supports_cooperative = False

    def assign(self, partitions_per_topic, subscriptions):
        out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        order = _sorted_members(subscriptions)
        for topic, count in sorted(_counts(partitions_per_topic, subscriptions).items()):
            members = [m for m in order if topic in subscriptions[m].topics]
            per, extra = divmod(count, len(members))
            start = 0
            for i, m in enumerate(members):
                n = per + (1 if i < extra else 0)
                out[m].extend(TopicPartition(topic, p) for p in range(start, start + n))
                start += n
        return out


class RoundRobinAssignor:
    """Every partition of every subscribed topic (topics by name, partitions ascending) to the next
    member in circular order that subscribes to its topic."""

    name = "roundrobin"
    supports_cooperative = False

    def assign(self, partitions_per_topic, subscriptions):
        out: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        order = _sorted_members(subscriptions)
        if not order:
            return out
        i = 0
        for topic, count in sorted(_counts(partitions_per_topic, subscriptions).items()):
            for p in range(count):
                while topic not in subscriptions[order[i % len(order)]].topics:
                    i += 1
                out[order[i % len(order)]].append(TopicPartition(topic, p))
                i += 1
        return out


@dataclass
class _StickyInput:
    members: list[str]
    eligible: dict[str, list[str]]                    # topic -> members subscribed, in order
    partitions: list[TopicPartition]                  # every assignable partition, sorted
    kept: dict[TopicPartition, str] = field(default_factory=dict)   # valid previous owner


def _previous_owners(subscriptions: dict[str, Subscription],
                     counts: dict[str, int]) -> dict[TopicPartition, str]:
    """The owner each partition may keep: its claimant with the highest generation, if that member
    still subscribes to the topic; two claimants in the same generation both lose it (as Java)."""
    best: dict[TopicPartition, tuple[int, str | None]] = {}
    for m in sorted(subscriptions):
        s = subscriptions[m]
        for tp in set(s.owned_partitions):
            if tp.partition >= counts.get(tp.topic, 0) or tp.topic not in s.topics:
                continue
            prev = best.get(tp)
            if prev is None or s.generation_id > prev[0]:
                best[tp] = (s.generation_id, m)
            elif s.generation_id == prev[0]:
                best[tp] = (prev[0], None)
    return {tp: m for tp, (_, m) in best.items() if m is not None}


def sticky_assign(partitions_per_topic: dict[str, int],
                  subscriptions: dict[str, Subscription]) -> dict[str, list[TopicPartition]]:
    """A balanced assignment that keeps as many partitions as possible with their valid owners."""
    counts = _counts(partitions_per_topic, subscriptions)
    members = _sorted_members(subscriptions)
    inp = _StickyInput(
        members=members,
        eligible={t: [m for m in members if t in subscriptions[m].topics] for t in counts},
        partitions=[TopicPartition(t, p) for t in sorted(counts) for p in range(counts[t])],
        kept=_previous_owners(subscriptions, counts))
    topic_sets = {frozenset(t for t in s.topics if t in counts) for s in subscriptions.values()}
    if not members:
        return {}
    if len(topic_sets) == 1:
        out = _constrained(inp)
    else:
        out = _general(inp)
    return {m: sorted(tps) for m, tps in out.items()}


def _constrained(inp: _StickyInput) -> dict[str, list[TopicPartition]]:
    """Equal subscriptions: each member keeps up to its quota of what it owns, the rest is dealt out."""
    n, total = len(inp.members), len(inp.partitions)
    min_quota, extra = divmod(total, n)
    owned: dict[str, list[TopicPartition]] = {m: [] for m in inp.members}
    for tp in inp.partitions:
        if tp in inp.kept:
            owned[inp.kept[tp]].append(tp)
    out: dict[str, list[TopicPartition]] = {m: [] for m in inp.members}
    slots = extra                       # members that may still end with min_quota + 1
    for m in sorted(inp.members, key=lambda m: -len(owned[m])):   # stable: member order within ties
        if len(owned[m]) > min_quota and slots > 0:
            out[m] = owned[m][:min_quota + 1]
            slots -= 1
        else:
            out[m] = owned[m][:min_quota]
    taken = {tp for tps in out.values() for tp in tps}
    free = iter([tp for tp in inp.partitions if tp not in taken])
    for m in inp.members:
        while len(out[m]) < min_quota:
            out[m].append(next(free))
    for m in inp.members:
        if slots <= 0:
            break
        if len(out[m]) == min_quota:
            tp = next(free, None)
            if tp is None:
                break
            out[m].append(tp)
            slots -= 1
    return out


def _general(inp: _StickyInput) -> dict[str, list[TopicPartition]]:
    """Unequal subscriptions: keep, place the rest on the least-loaded eligible member, then move
    partitions from members with two more than an eligible one."""
    out: dict[str, list[TopicPartition]] = {m: [] for m in inp.members}
    rank = {m: i for i, m in enumerate(inp.members)}
    for tp in inp.partitions:
        if tp in inp.kept:
            out[inp.kept[tp]].append(tp)
    free = [tp for tp in inp.partitions if tp not in inp.kept]
    free.sort(key=lambda tp: (len(inp.eligible[tp.topic]), tp))
    for tp in free:
        target = min(inp.eligible[tp.topic], key=lambda m: (len(out[m]), rank[m]))
        out[target].append(tp)
    for _ in range(len(inp.partitions) * len(inp.members) + 1):   # each move lowers the imbalance
        move = _one_move(inp, out, rank)
        if move is None:
            break
        tp, src, dst = move
        out[src].remove(tp)
        out[dst].append(tp)
    return out


def _one_move(inp: _StickyInput, out, rank):
    for src in sorted(inp.members, key=lambda m: (-len(out[m]), rank[m])):
        for tp in sorted(out[src], key=lambda tp: (tp in inp.kept and inp.kept[tp] == src, tp)):
            dst = min(inp.eligible[tp.topic], key=lambda m: (len(out[m]), rank[m]))
            if len(out[dst]) + 1 < len(out[src]):
                return tp, src, dst
    return None


class CooperativeStickyAssignor:
    """Sticky and balanced; partitions that change owners are withheld for the follow-up rebalance."""

    name = "cooperative-sticky"
    supports_cooperative = True

    def assign(self, partitions_per_topic, subscriptions):
        target = sticky_assign(partitions_per_topic, subscriptions)
        claimed: dict[TopicPartition, set[str]] = {}
        for m, s in subscriptions.items():
            for tp in s.owned_partitions:
                claimed.setdefault(tp, set()).add(m)
        # Any other member's claim (of any generation) holds the partition back one round, so no two
        # members ever own it at once; the claimant revokes it and asks for the next rebalance.
        return {m: [tp for tp in tps if not (claimed.get(tp, set()) - {m})] for m, tps in target.items()}


_BY_NAME = {
    "range": RangeAssignor, "org.apache.kafka.clients.consumer.RangeAssignor": RangeAssignor,
    "roundrobin": RoundRobinAssignor, "org.apache.kafka.clients.consumer.RoundRobinAssignor": RoundRobinAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": CooperativeStickyAssignor,
}


def assignors_from_config(value) -> list:
    """partition.assignment.strategy: a comma-separated string or a list of names or assignor objects,
    in order of preference."""
    out = assignors_named(value, "partition.assignment.strategy", _BY_NAME, ("name", "assign"))
    if not out:
        raise ConfigError("partition.assignment.strategy is empty")
    return out


def assignors_named(value, setting: str, by_name: dict, needs: tuple[str, ...]) -> list:
    """The assignors a setting names: a comma-separated string, or a list of names (looked up in
    `by_name`, case-insensitively) and objects with the attributes `needs`; each name once."""
    items: Iterable = value.split(",") if isinstance(value, str) else value
    out = []
    for item in items:
        if isinstance(item, str):
            name = item.strip()
            if not name:
                continue
            cls = by_name.get(name) or by_name.get(name.lower())
            if cls is None:
                known = ", ".join(n for n in by_name if "." not in n)
                raise ConfigError(f"{setting}: unknown assignor {name!r} (known: {known})")
            out.append(cls())
        elif all(hasattr(item, a) for a in needs):
            out.append(item)
        else:
            raise ConfigError(f"{setting}: {item!r} is not an assignor")
    if len({a.name for a in out}) != len(out):
        raise ConfigError(f"{setting} names an assignor twice")
    return out
