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
changes, which is what range means.

Racks (Kafka's rack-aware assignment, KIP-881 on the client and the broker's assignors since 3.7):
each member may have a rack (the heartbeat's RackId, from `client.rack`) and each partition has the
racks of its replicas (`broker.rack` of the replica brokers, from the metadata image). When both are
known and some member's rack lacks a replica of some partition, the assignors prefer giving a member
partitions with a replica in its rack, without changing how many each member gets:

- `range`: per topic, each member (in member-id order) first takes, up to its share, the partitions
  with a replica in its rack, lowest first; then the shares are filled with what is left, lowest
  first. Topics whose partitions have the same racks stay co-partitioned.
- `uniform`: stickiness first (a member keeps its partitions while its quota allows), but a member
  over its quota gives up the partitions outside its rack first; free partitions go first to members
  under quota in their rack; with different subscriptions, a free partition goes to the least-loaded
  subscriber in its rack unless another subscriber is less loaded, and balancing moves partitions out
  of the donor's rack into the taker's first.

Cost: O(P + M log M) for `uniform` with identical subscriptions and for `range`, O(P log M) plus
the balancing moves otherwise (see bench/assignor_bench.py).
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Mapping, Sequence, Set
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


PartitionRacks = Mapping[TopicId, Sequence[frozenset[str]]]   # topic -> racks of each partition's replicas


class _Racks:
    """Which partitions have a replica in a member's rack; `active` only when that can matter."""

    def __init__(self, members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int],
                 racks: PartitionRacks | None) -> None:
        self.member_rack = {m: s.rack_id for m, s in members.items() if s.rack_id}
        self.racks = racks or {}
        wanted = set(self.member_rack.values())
        self.active = bool(wanted) and any(
            any(r and not wanted <= r for r in self.racks.get(t, ())) for t in topics)

    def local(self, member_id: str, t: TopicId, p: int) -> bool:
        rack = self.member_rack.get(member_id)
        if rack is None:
            return False
        parts = self.racks.get(t, ())
        return p < len(parts) and rack in parts[p]


def assign(name: str, members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int],
           current: Mapping[str, Mapping[TopicId, Set[int]]], racks: PartitionRacks | None = None) -> GroupAssignment:
    """The target assignment of every member. `topics`: partition count of each subscribed topic
    that exists (topics not listed are ignored); `current`: the previous target assignment; `racks`:
    the racks of each partition's replicas, by topic (rack-aware when given, see the module doc)."""
    r = _Racks(members, topics, racks)
    if name == UNIFORM:
        return uniform(members, topics, current, r if r.active else None)
    if name == RANGE:
        return range_assign(members, topics, r if r.active else None)
    raise AssignorError(f"unknown assignor {name!r}")


# ------------------------------------------------------------------------------------------ range
def range_assign(members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int],
                 racks: _Racks | None = None) -> GroupAssignment:
    out: GroupAssignment = {m: {} for m in members}
    subscribers: dict[TopicId, list[str]] = {}
    for member_id in sorted(members):
        for t in members[member_id].subscribed:
            if t in topics:
                subscribers.setdefault(t, []).append(member_id)
    for t, subs in subscribers.items():
        quota, extra = divmod(topics[t], len(subs))
        if racks is not None:
            _range_racks(t, topics[t], subs, quota, extra, racks, out)
            continue
        start = 0
        for i, member_id in enumerate(subs):
            n = quota + (1 if i < extra else 0)
            if n:
                out[member_id][t] = set(range(start, start + n))
            start += n
    return out


def _range_racks(t: TopicId, count: int, subs: list[str], quota: int, extra: int, racks: _Racks,
                 out: GroupAssignment) -> None:
    share = {m: quota + (1 if i < extra else 0) for i, m in enumerate(subs)}
    free = set(range(count))
    got: dict[str, list[int]] = {m: [] for m in subs}
    for m in subs:
        for p in range(count):
            if len(got[m]) >= share[m]:
                break
            if p in free and racks.local(m, t, p):
                got[m].append(p)
                free.discard(p)
    rest = sorted(free)
    for m in subs:
        need = share[m] - len(got[m])
        got[m] += rest[:need]
        del rest[:need]
        if got[m]:
            out[m][t] = set(got[m])


# ------------------------------------------------------------------------------------------ uniform
def uniform(members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int],
            current: Mapping[str, Mapping[TopicId, Set[int]]], racks: _Racks | None = None) -> GroupAssignment:
    if not members:
        return {}
    subscriptions = {frozenset(spec.subscribed & topics.keys()) for spec in members.values()}
    if len(subscriptions) == 1:
        return _uniform_homogeneous(members, sorted(next(iter(subscriptions)), key=str), topics, current, racks)
    return _uniform_heterogeneous(members, topics, current, racks)


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
                         topics: Mapping[TopicId, int], current: Mapping[str, Mapping[TopicId, Set[int]]],
                         racks: _Racks | None = None) -> GroupAssignment:
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
        if racks is not None and len(kept[m]) > target[m]:   # give up the partitions outside the rack first
            local = {tp for tp in kept[m] if racks.local(m, *tp)}
            kept[m].sort(key=lambda tp: tp not in local)
        surplus = kept[m][target[m]:]
        if surplus:
            del kept[m][target[m]:]
            taken.difference_update(surplus)
    if racks is not None:
        _fill_in_rack(ids, subscribed, topics, target, kept, taken, racks)
    free = ((t, p) for t in subscribed for p in range(topics[t]) if (t, p) not in taken)
    for m in ids:
        need = target[m] - len(kept[m])
        for _ in range(need):
            kept[m].append(next(free))
    return {m: _group(kept[m]) for m in ids}


def _fill_in_rack(ids: list[str], subscribed: list[TopicId], topics: Mapping[TopicId, int], target: dict[str, int],
                  kept: dict[str, list[tuple[TopicId, int]]], taken: set[tuple[TopicId, int]], racks: _Racks) -> None:
    """Free partitions to members under quota with a replica in their rack, one at a time in member
    order (so members of one rack share its partitions evenly)."""
    by_rack: dict[str, list[tuple[TopicId, int]]] = {}
    for t in subscribed:
        parts = racks.racks.get(t, ())
        for p in range(topics[t]):
            if (t, p) not in taken and p < len(parts):
                for r in parts[p]:
                    by_rack.setdefault(r, []).append((t, p))
    position = dict.fromkeys(by_rack, 0)
    hungry = [m for m in ids if racks.member_rack.get(m) in by_rack and len(kept[m]) < target[m]]
    while hungry:
        still = []
        for m in hungry:
            rack = racks.member_rack[m]
            cands, i = by_rack[rack], position[rack]
            while i < len(cands) and cands[i] in taken:
                i += 1
            position[rack] = i
            if i == len(cands):
                continue
            taken.add(cands[i])
            kept[m].append(cands[i])
            if len(kept[m]) < target[m]:
                still.append(m)
        hungry = still


def _uniform_heterogeneous(members: Mapping[str, MemberSpec], topics: Mapping[TopicId, int],
                           current: Mapping[str, Mapping[TopicId, Set[int]]],
                           racks: _Racks | None = None) -> GroupAssignment:
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
        if racks is not None:
            for p in free:
                least = min(subscribers[t], key=lambda m: (load[m], m))
                local = [m for m in subscribers[t] if racks.local(m, t, p)]
                best = min(local, key=lambda m: (load[m], m)) if local else least
                if load[best] > load[least]:
                    best = least
                owned[best].setdefault(t, set()).add(p)
                load[best] += 1
            continue
        heap = [(load[m], m) for m in subscribers[t]]
        heapq.heapify(heap)
        for p in free:
            n, m = heapq.heappop(heap)
            owned[m].setdefault(t, set()).add(p)
            load[m] = n + 1
            heapq.heappush(heap, (n + 1, m))
    _balance(subscribers, owned, load, racks)
    return {m: {t: ps for t, ps in owned[m].items() if ps} for m in ids}


def _balance(subscribers: Mapping[TopicId, list[str]], owned: dict[str, dict[TopicId, set[int]]],
             load: dict[str, int], racks: _Racks | None = None) -> None:
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
                if racks is None:
                    p = max(owned[donor][t])
                else:   # out of the donor's rack and into the taker's first
                    p = max(owned[donor][t], key=lambda q: (not racks.local(donor, t, q), racks.local(taker, t, q), q))
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
