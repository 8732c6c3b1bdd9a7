"""Rack-aware server-side assignment (Kafka's behaviour since 3.7, KIP-881's rules): members' racks from
the heartbeat's RackId, partitions' replica racks from the metadata image. Worked examples for range
and uniform, the cases where racks cannot matter, and a group assigned through the coordinator."""

import uuid

from odradek.coordinator import consumer_heartbeat
from odradek.coordinator.assignors_server import MemberSpec, assign
from odradek.coordinator.consumer_group import TopicsView
from odradek.coordinator.consumer_records import TopicMeta
from odradek.coordinator.membership import Caller
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from tests.unit.coordinator.harness import Harness

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)
A, B = frozenset({"A"}), frozenset({"B"})
ALTERNATING = (A, B, A, B)       # single replicas: p0 in A, p1 in B, ...


def m(*topics, rack=None):
    return MemberSpec(frozenset(topics), rack)


def parts(assignment, t=T1):
    return {member: sorted(ps.get(t, ())) for member, ps in assignment.items()}


def test_range_prefers_partitions_in_the_members_rack():
    members = {"a": m(T1, rack="A"), "b": m(T1, rack="B")}
    assert parts(assign("range", members, {T1: 4}, {}, {T1: ALTERNATING})) == {"a": [0, 2], "b": [1, 3]}
    # Without racks (or without rack information) the ranges are contiguous.
    assert parts(assign("range", members, {T1: 4}, {})) == {"a": [0, 1], "b": [2, 3]}
    assert parts(assign("range", {"a": m(T1), "b": m(T1)}, {T1: 4}, {}, {T1: ALTERNATING})) == \
        {"a": [0, 1], "b": [2, 3]}


def test_range_keeps_shares_and_fills_them_with_what_is_left():
    members = {"a1": m(T1, rack="A"), "a2": m(T1, rack="A"), "b": m(T1, rack="B")}
    racks = {T1: (A, B, A, B, A, B)}
    # Shares 2, 2, 2: a1 takes A's first two, a2 A's last and the one B partition b leaves.
    assert parts(assign("range", members, {T1: 6}, {}, racks)) == {"a1": [0, 2], "a2": [4, 5], "b": [1, 3]}


def test_range_stays_co_partitioned_when_topics_have_the_same_racks():
    members = {"a": m(T1, T2, rack="A"), "b": m(T1, T2, rack="B")}
    out = assign("range", members, {T1: 4, T2: 4}, {}, {T1: ALTERNATING, T2: ALTERNATING})
    assert parts(out, T1) == parts(out, T2) == {"a": [0, 2], "b": [1, 3]}


def test_racks_that_every_partition_has_change_nothing():
    everywhere = {T1: (A | B,) * 4}
    members = {"a": m(T1, rack="A"), "b": m(T1, rack="B")}
    assert parts(assign("range", members, {T1: 4}, {}, everywhere)) == {"a": [0, 1], "b": [2, 3]}
    assert parts(assign("uniform", members, {T1: 4}, {}, everywhere)) == \
        parts(assign("uniform", members, {T1: 4}, {}))


def test_uniform_fresh_group_in_racks():
    members = {"a": m(T1, rack="A"), "b": m(T1, rack="B")}
    assert parts(assign("uniform", members, {T1: 4}, {}, {T1: ALTERNATING})) == {"a": [0, 2], "b": [1, 3]}


def test_uniform_member_joining_takes_the_partitions_of_its_rack():
    first = assign("uniform", {"a": m(T1, rack="A")}, {T1: 4}, {}, {T1: ALTERNATING})
    assert parts(first) == {"a": [0, 1, 2, 3]}
    members = {"a": m(T1, rack="A"), "b": m(T1, rack="B")}
    # a is over its quota: it gives up the partitions outside its rack, and b (rack B) gets them.
    assert parts(assign("uniform", members, {T1: 4}, first, {T1: ALTERNATING})) == {"a": [0, 2], "b": [1, 3]}
    # Without racks a keeps its lowest partitions.
    assert parts(assign("uniform", {"a": m(T1), "b": m(T1)}, {T1: 4}, first)) == {"a": [0, 1], "b": [2, 3]}


def test_uniform_shares_a_rack_evenly_and_balances_a_member_without_rack():
    members = {"a1": m(T1, rack="A"), "a2": m(T1, rack="A"), "c": m(T1)}
    racks = {T1: (A, A, A, A, B, B)}
    out = parts(assign("uniform", members, {T1: 6}, {}, racks))
    assert sorted(map(len, out.values())) == [2, 2, 2]
    assert set(out["a1"]) | set(out["a2"]) == {0, 1, 2, 3} and out["c"] == [4, 5]


def test_uniform_different_subscriptions_prefer_the_rack_without_unbalancing():
    members = {"a": m(T1, T2, rack="A"), "b": m(T1, rack="B")}
    racks = {T1: ALTERNATING, T2: (B, B)}
    out = assign("uniform", members, {T1: 4, T2: 2}, {}, racks)
    load = {x: sum(len(ps) for ps in out[x].values()) for x in out}
    assert load == {"a": 3, "b": 3}
    assert sorted(out["a"][T2]) == [0, 1]                     # only a subscribes to T2
    # a has room for one partition of T1: one in its rack; b gets both of its rack's and the other.
    assert {1, 3} <= set(out["b"][T1]) and len(out["a"][T1]) == 1 and set(out["a"][T1]) <= {0, 2}


def test_the_coordinator_assigns_by_rack():
    h = Harness()
    view = TopicsView({"orders": TopicMeta(T1, 4)}, racks={"orders": ALTERNATING})
    answers = {}
    for member, rack in (("a", "A"), ("b", "B")):
        req = cgh.ConsumerGroupHeartbeatRequest(group_id="cg", member_id=member, member_epoch=0, rack_id=rack,
                                                rebalance_timeout_ms=30_000, subscribed_topic_names=["orders"],
                                                topic_partitions=[])
        r = h.run(consumer_heartbeat.heartbeat, req, Caller("c", "/h", 1), view)
        assert r.error_code == ErrorCode.NONE
        answers[member] = r
    target = h.shard.consumer_groups["cg"].target
    assert target == {"a": {T1: frozenset({0, 2})}, "b": {T1: frozenset({1, 3})}}


def test_random_groups_with_racks_keep_the_invariants():
    import random
    rng = random.Random(7)
    for _ in range(200):
        topics = {uuid.UUID(int=10 + i): rng.randint(1, 12) for i in range(rng.randint(1, 3))}
        racks = {t: tuple(frozenset(rng.sample("ABC", rng.randint(0, 2))) for _ in range(n)) for t, n in topics.items()}
        homogeneous = rng.random() < 0.5
        members = {}
        for i in range(rng.randint(1, 6)):
            subs = frozenset(topics) if homogeneous else frozenset(rng.sample(sorted(topics, key=str),
                                                                                rng.randint(1, len(topics))))
            members[f"m{i}"] = MemberSpec(subs, rng.choice([None, "A", "B", "C"]))
        previous = assign("uniform", members, topics, {}, racks)
        for name in ("uniform", "range"):
            out = assign(name, members, topics, previous, racks)
            plain = assign(name, members, topics, previous)
            seen = set()
            for member, assigned in out.items():
                for t, ps in assigned.items():
                    assert t in members[member].subscribed
                    for p in ps:
                        assert (t, p) not in seen
                        seen.add((t, p))
            wanted = {(t, p) for s in members.values() for t in s.subscribed for p in range(topics[t])}
            assert seen == wanted
            if name == "range":   # the same shares per topic as without racks
                for t in topics:
                    assert sorted(len(a.get(t, ())) for a in out.values()) == \
                        sorted(len(a.get(t, ())) for a in plain.values())
            elif homogeneous:
                loads = [sum(len(ps) for ps in a.values()) for a in out.values()]
                assert max(loads) - min(loads) <= 1
