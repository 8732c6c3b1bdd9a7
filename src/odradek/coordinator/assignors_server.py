"""The server-side partition assignors of the consumer group protocol (seed 002, "Broker API": a
`PartitionAssignor` on the broker with two implementations, `range` and `uniform`; members pick one
with `server_assignor` from `group.consumer.assignors`, whose first entry is the default).

An assignor is a pure function of the group: each member's subscribed topic ids, every subscribed
topic's partition count, and the current target assignment (for stickiness). It returns a target
assignment for every member (possibly empty); a partition goes to at most one member, and only to
a member subscribed to its topic.

`uniform` spreads partitions so that member counts differ by at most one and keeps every partition
where it is when that does not break the balance (a member joining or leaving moves only the
partitions that must move). With identical subscriptions it is exact: `divmod(P, M)` gives each
member its quota, the `P mod M` larger quotas go to the members already holding the most. With
different subscriptions it keeps what it can, hands each unassigned partition to the least-loaded
subscriber of its topic (most constrained topics first), then moves partitions from a subscriber
to a less-loaded one while they differ by more than one.

`range` gives each subscriber of a topic a contiguous range of its partitions, members in member-id
order, the first `P mod n` one partition more (Kafka's range assignor): topics with the same
partition count are co-partitioned (partition i of each goes to the same member). It is
deterministic, so an unchanged group gets the same ranges; it is not sticky across membership
changes, which is what range means. Rack ids are recorded but neither assignor uses them yet.

Cost: O(P + M log M) for `uniform` with identical subscriptions and for `range`, O(P log M) plus
the balancing moves otherwise (see bench/assignor_bench.py).
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Mapping, Set
from dataclasses import dataclass

TopicId = uuid.UUID
MemberAssignment = dict[TopicId, set[int]]
GroupAssignment = dict[str, MemberAssignment]

UNIFORM = "uniform"
RANGE = "range"
ASSIGNORS = (UNIFORM, RANGE)


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """What an assignor knows of a member."""
    subscribed: frozenset[TopicId]
    rack_id: str | None = None
    instance_id: str | None = None


class AssignorError(ValueError):
    """The assignor name is not one this broker offers."""


def assign(name: str, members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int],
           current: Mapping[str, Mapping[TopicId, Set[int]]]) -> GroupAssignment:
    """The target assignment of every member. `topics`: partition count of each subscribed topic
    that exists (topics not listed are ignored); `current`: the previous target assignment."""
    if name == UNIFORM:
        return uniform(members, topics, current)
    if name == RANGE:
        return range_assign(members, topics)
    raise AssignorError(f"unknown assignor {name!r}")


# ------------------------------------------------------------------------------------------ range
def range_assign(members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int]) -> GroupAssignment:
    out: GroupAssignment = {m: {} for m in members}
    subscribers: dict[TopicId, list[str]] = {}
    for member_id in sorted(members):
        for t in members[member_id].subscribed:
            if t in topics:
                subscribers.setdefault(t, []).append(member_id)
    for t, subs in subscribers.items():
        quota, extra = divmod(topics[t], len(subs))
        start = 0
        for i, member_id in enumerate(subs):
            n = quota + (1 if i < extra else 0)
            if n:
                out[member_id][t] = set(range(start, start + n))
            start += n
    return out


# ------------------------------------------------------------------------------------------ uniform
def uniform(members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int],
            current: Mapping[str, Mapping[TopicId, Set[int]]]) -> GroupAssignment:
    if not members:
        return {}
    subscriptions = {frozenset(spec.subscribed & topics.keys()) for spec in members.values()}
    if len(subscriptions) == 1:
        return _uniform_homogeneous(members, sorted(next(iter(subscriptions)), key=str), topics, current)
    return _uniform_heterogeneous(members, topics, current)


def _retained(member_id: str, subscribed: Set[TopicId], topics: Mapping[TopicId, int],
              current: Mapping[str, Mapping[TopicId, Set[int]]], taken: set[tuple[TopicId, int]]
              ) -> list[tuple[TopicId, int]]:
    """The member's previous partitions it may keep: still subscribed, still existing, and not
    already kept by another member (a corrupt or concurrent previous assignment)."""
    kept = []
    for t, parts in current.get(member_id, {}).items():
        count = topics.get(t)
        if count is None or t not in subscribed:
            continue
        for p in sorted(parts):
            tp = (t, p)
            if p < count and tp not in taken:
                taken.add(tp)
                kept.append(tp)
    return kept


def _uniform_homogeneous(members: Mapping[str, MemberSpec], subscribed: list[TopicId],
                         topics: Mapping[TopicId, int],
                         current: Mapping[str, Mapping[TopicId, Set[int]]]) -> GroupAssignment:
    ids = sorted(members)
    total = sum(topics[t] for t in subscribed)
    quota, extra = divmod(total, len(ids))
    subscribed_set = set(subscribed)
    taken: set[tuple[TopicId, int]] = set()
    kept = {m: _retained(m, subscribed_set, topics, current, taken) for m in ids}
    # The larger quotas go to the members that already hold the most: fewest moves.
    by_holding = sorted(ids, key=lambda m: (-len(kept[m]), m))
    target = {m: quota + (1 if i < extra else 0) for i, m in enumerate(by_holding)}
    for m in ids:
        surplus = kept[m][target[m]:]
        if surplus:
            del kept[m][target[m]:]
            taken.difference_update(surplus)
    free = ((t, p) for t in subscribed for p in range(topics[t]) if (t, p) not in taken)
    for m in ids:
        need = target[m] - len(kept[m])
        for _ in range(need):
            kept[m].append(next(free))
    return {m: _group(kept[m]) for m in ids}


def _uniform_heterogeneous(members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int],
                           current: Mapping[str, Mapping[TopicId, Set[int]]]) -> GroupAssignment:
    ids = sorted(members)
    subscribers: dict[TopicId, list[str]] = {}
    for m in ids:
        for t in members[m].subscribed:
            if t in topics:
                subscribers.setdefault(t, []).append(m)
    taken: set[tuple[TopicId, int]] = set()
    owned: dict[str, dict[TopicId, set[int]]] = {m: {} for m in ids}
    load = dict.fromkeys(ids, 0)
    for m in ids:
        for t, p in _retained(m, members[m].subscribed, topics, current, taken):
            owned[m].setdefault(t, set()).add(p)
            load[m] += 1
    # Unassigned partitions: most constrained topics first, each to its least-loaded subscriber.
    for t in sorted(subscribers, key=lambda t: (len(subscribers[t]), str(t))):
        free = [p for p in range(topics[t]) if (t, p) not in taken]
        if not free:
            continue
        heap = [(load[m], m) for m in subscribers[t]]
        heapq.heapify(heap)
        for p in free:
            n, m = heapq.heappop(heap)
            owned[m].setdefault(t, set()).add(p)
            load[m] = n + 1
            heapq.heappush(heap, (n + 1, m))
    _balance(subscribers, owned, load)
    return {m: {t: ps for t, ps in owned[m].items() if ps} for m in ids}


def _balance(subscribers: Mapping[TopicId, list[str]], owned: dict[str, dict[TopicId, set[int]]],
             load: dict[str, int]) -> None:
    """Move partitions from a subscriber to a less-loaded subscriber of the same topic while their
    loads differ by more than one. Every move lowers the sum of squared loads, so this ends; the
    passes are bounded anyway. Per topic, the most and least loaded subscribers come from two heaps
    whose stale entries (a load changed since) are dropped when they surface."""
    for _ in range(len(load) + 1):
        moved = False
        for t, subs in subscribers.items():
            if len(subs) < 2:
                continue
            donors = [(-load[m], m) for m in subs if owned[m].get(t)]
            takers = [(load[m], m) for m in subs]
            heapq.heapify(donors)
            heapq.heapify(takers)
            while donors and takers:
                neg, donor = donors[0]
                if -neg != load[donor] or not owned[donor].get(t):
                    heapq.heappop(donors)
                    if owned[donor].get(t) and -neg != load[donor]:
                        heapq.heappush(donors, (-load[donor], donor))
                    continue
                n, taker = takers[0]
                if n != load[taker]:
                    heapq.heapreplace(takers, (load[taker], taker))
                    continue
                if load[donor] - load[taker] <= 1:
                    break
                p = max(owned[donor][t])
                owned[donor][t].discard(p)
                owned[taker].setdefault(t, set()).add(p)
                load[donor] -= 1
                load[taker] += 1
                moved = True
                heapq.heappush(donors, (-load[taker], taker))
                heapq.heappush(takers, (load[donor], donor))
        if not moved:
            return


def _group(partitions: list[tuple[TopicId, int]]) -> MemberAssignment:
    out: MemberAssignment = {}
    for t, p in partitions:
        out.setdefault(t, set()).add(p)
    return out
