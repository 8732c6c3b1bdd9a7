"""Client-side assignors: Java's RangeAssignor and RoundRobinAssignor orders (the cases of Kafka's own
assignor tests, worked by hand), and cooperative-sticky's invariants over random groups."""

from __future__ import annotations

import random

import pytest

from odradek.client.assignors import (
    CooperativeStickyAssignor, RangeAssignor, RoundRobinAssignor, Subscription, assignors_from_config,
    sticky_assign,
)
from odradek.client.errors import ConfigError
from odradek.client.fetcher import TopicPartition as TP


def subs(**topics_by_member) -> dict[str, Subscription]:
    return {m: Subscription(tuple(ts)) for m, ts in topics_by_member.items()}


def tps(*pairs) -> list[TP]:
    return [TP(t, p) for t, p in pairs]


# ------------------------------------------------------------------------------------------ range
def test_range_two_consumers_two_topics():
    # Java's RangeAssignor javadoc: C0 [t0p0, t0p1, t1p0, t1p1], C1 [t0p2, t1p2]
    got = RangeAssignor().assign({"t0": 3, "t1": 3}, subs(C0=["t0", "t1"], C1=["t0", "t1"]))
    assert got == {"C0": tps(("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)), "C1": tps(("t0", 2), ("t1", 2))}


def test_range_mixed_subscriptions():
    got = RangeAssignor().assign({"topic1": 3, "topic2": 2},
                                 subs(consumer1=["topic1"], consumer2=["topic1", "topic2"], consumer3=["topic1"]))
    assert got == {"consumer1": tps(("topic1", 0)),
                   "consumer2": tps(("topic1", 1), ("topic2", 0), ("topic2", 1)),
                   "consumer3": tps(("topic1", 2))}


def test_range_more_consumers_than_partitions_and_missing_topics():
    got = RangeAssignor().assign({"t": 1}, subs(a=["t", "gone"], b=["t"]))
    assert got == {"a": tps(("t", 0)), "b": []}
    assert RangeAssignor().assign({}, subs(a=["gone"])) == {"a": []}


def test_range_orders_static_members_first_by_instance_id():
    members = {"m-z": Subscription(("t",), group_instance_id="i-1"),
               "m-a": Subscription(("t",), group_instance_id="i-2"),
               "m-0": Subscription(("t",))}
    got = RangeAssignor().assign({"t": 7}, members)
    assert got == {"m-z": tps(("t", 0), ("t", 1), ("t", 2)), "m-a": tps(("t", 3), ("t", 4)),
                   "m-0": tps(("t", 5), ("t", 6))}


def test_range_sorts_member_ids_as_java_strings():
    # Java's String.compareTo and Python's str order agree for member ids (ASCII): uppercase first.
    got = RangeAssignor().assign({"t": 3}, subs(b=["t"], B=["t"], a=["t"]))
    assert got == {"B": tps(("t", 0)), "a": tps(("t", 1)), "b": tps(("t", 2))}


# ------------------------------------------------------------------------------------------ roundrobin
def test_roundrobin_two_consumers_two_topics():
    got = RoundRobinAssignor().assign({"t0": 3, "t1": 3}, subs(C0=["t0", "t1"], C1=["t0", "t1"]))
    assert got == {"C0": tps(("t0", 0), ("t0", 2), ("t1", 1)), "C1": tps(("t0", 1), ("t1", 0), ("t1", 2))}


def test_roundrobin_mixed_subscriptions_skip_members_not_subscribed():
    got = RoundRobinAssignor().assign({"topic1": 3, "topic2": 2},
                                      subs(consumer1=["topic1"], consumer2=["topic1", "topic2"],
                                           consumer3=["topic1"]))
    assert got == {"consumer1": tps(("topic1", 0)),
                   "consumer2": tps(("topic1", 1), ("topic2", 0), ("topic2", 1)),
                   "consumer3": tps(("topic1", 2))}


def test_roundrobin_static_members():
    members = {"x": Subscription(("t",), group_instance_id="b"), "y": Subscription(("t",), group_instance_id="a"),
               "a": Subscription(("t",))}
    got = RoundRobinAssignor().assign({"t": 4}, members)
    assert got == {"y": tps(("t", 0), ("t", 3)), "x": tps(("t", 1)), "a": tps(("t", 2))}


# ------------------------------------------------------------------------------------------ sticky
def test_sticky_fresh_group_is_balanced():
    got = sticky_assign({"t": 6}, subs(a=["t"], b=["t"], c=["t"]))
    assert sorted(len(v) for v in got.values()) == [2, 2, 2]
    assert sorted(tp for v in got.values() for tp in v) == tps(*[("t", p) for p in range(6)])


def test_sticky_keeps_owners_when_a_member_joins():
    owned = {"a": tps(("t", 0), ("t", 1), ("t", 2)), "b": tps(("t", 3), ("t", 4), ("t", 5))}
    members = {m: Subscription(("t",), tuple(ps), 1) for m, ps in owned.items()}
    members["c"] = Subscription(("t",))
    got = sticky_assign({"t": 6}, members)
    assert set(got["a"]) <= set(owned["a"]) and set(got["b"]) <= set(owned["b"])
    assert [len(got[m]) for m in "abc"] == [2, 2, 2]


def test_sticky_same_generation_claims_are_dropped_and_the_newer_generation_wins():
    members = {"a": Subscription(("t",), tps(("t", 0), ("t", 1)), 5),
               "b": Subscription(("t",), tps(("t", 1),), 5),
               "c": Subscription(("t",), tps(("t", 0),), 4)}
    got = sticky_assign({"t": 3}, members)
    assert TP("t", 0) in got["a"]                 # a (generation 5) beats c (4)
    assert sorted(len(v) for v in got.values()) == [1, 1, 1]


def test_cooperative_withholds_partitions_that_change_owners():
    owned = {"a": tps(("t", 0), ("t", 1), ("t", 2)), "b": tps(("t", 3), ("t", 4), ("t", 5))}
    members = {m: Subscription(("t",), tuple(ps), 1) for m, ps in owned.items()}
    members["c"] = Subscription(("t",))
    first = CooperativeStickyAssignor().assign({"t": 6}, members)
    assert first["c"] == [] and len(first["a"]) == 2 and len(first["b"]) == 2
    # the follow-up rebalance: a and b revoked one each; c gets them
    second = CooperativeStickyAssignor().assign({"t": 6}, {
        "a": Subscription(("t",), tuple(first["a"]), 2), "b": Subscription(("t",), tuple(first["b"]), 2),
        "c": Subscription(("t",), (), 2)})
    assert second["a"] == first["a"] and second["b"] == first["b"] and len(second["c"]) == 2


def test_cooperative_unequal_subscriptions():
    members = {"a": Subscription(("x", "y")), "b": Subscription(("y",)), "c": Subscription(("x",))}
    got = CooperativeStickyAssignor().assign({"x": 4, "y": 2}, members)
    assert all(tp.topic in members[m].topics for m, ps in got.items() for tp in ps)
    assert sorted(tp for ps in got.values() for tp in ps) == sorted(tps(*[("x", p) for p in range(4)],
                                                                        ("y", 0), ("y", 1)))
    assert max(map(len, got.values())) - min(map(len, got.values())) <= 1


@pytest.mark.parametrize("seed", range(40))
def test_cooperative_rounds_converge_without_double_ownership(seed):
    """Random groups, random joins and leaves: within a round no partition is given to a member while
    another still holds it; two rounds after the last change everything is assigned, each partition to
    a subscriber, and with equal subscriptions the loads differ by at most one."""
    rnd = random.Random(seed)
    counts = {t: rnd.randint(1, 8) for t in "abc"}
    equal = rnd.random() < 0.5

    def topics() -> tuple[str, ...]:
        return tuple(counts) if equal else tuple(sorted(rnd.sample(sorted(counts), rnd.randint(1, 3))))

    members = {f"m{i}": topics() for i in range(rnd.randint(1, 5))}
    owned: dict[str, list[TP]] = {m: [] for m in members}
    generation = 0
    for change in range(6):
        if change and rnd.random() < 0.5 and len(members) > 1:
            gone = rnd.choice(sorted(members))
            del members[gone], owned[gone]
        elif change:
            new = f"n{change}"
            members[new], owned[new] = topics(), []
        for _ in range(3):                                       # rebalance rounds
            generation += 1
            group = {m: Subscription(ts, tuple(owned[m]), generation - 1) for m, ts in members.items()}
            result = CooperativeStickyAssignor().assign(counts, group)
            held = {tp: m for m, ps in owned.items() for tp in ps}
            for m, ps in result.items():
                for tp in ps:
                    assert held.get(tp, m) == m, f"{tp} given to {m} while {held[tp]} holds it"
            owned = {m: list(result[m]) for m in members}
        every = [tp for ps in owned.values() for tp in ps]
        assert len(every) == len(set(every))
        want = sorted(TP(t, p) for t, n in counts.items() if any(t in ts for ts in members.values())
                      for p in range(n))
        assert sorted(every) == want
        assert all(tp.topic in members[m] for m, ps in owned.items() for tp in ps)
        if equal:
            loads = [len(ps) for ps in owned.values()]
            assert max(loads) - min(loads) <= 1


# ------------------------------------------------------------------------------------------ config
def test_strategy_names_and_java_class_names():
    got = assignors_from_config("range, org.apache.kafka.clients.consumer.RoundRobinAssignor,"
                                "org.apache.kafka.clients.consumer.CooperativeStickyAssignor")
    assert [a.name for a in got] == ["range", "roundrobin", "cooperative-sticky"]
    assert [a.name for a in assignors_from_config(["cooperative-sticky"])] == ["cooperative-sticky"]
    with pytest.raises(ConfigError):
        assignors_from_config("sticky-ish")
    with pytest.raises(ConfigError):
        assignors_from_config("range,range")
