"""The server-side assignors (seed 002, "Broker API": range and uniform): worked examples, stickiness,
and the invariants on random groups (every subscribed partition assigned exactly once, only to a
subscriber; uniform balanced within one; a joining or leaving member moves only what must move)."""

import random
import uuid

import pytest

from odradek.coordinator.assignors_server import AssignorError, MemberSpec, assign

T1, T2, T3 = (uuid.UUID(int=i) for i in (1, 2, 3))


def spec(*topics):
    return MemberSpec(frozenset(topics))


def flat(assignment):
    return {m: sorted((str(t)[-1], p) for t, ps in parts.items() for p in ps) for m, parts in assignment.items()}


def owners(assignment):
    out = {}
    for m, parts in assignment.items():
        for t, ps in parts.items():
            for p in ps:
                assert (t, p) not in out, f"{(t, p)} has two owners"
                out[(t, p)] = m
    return out


def check_complete(members, topics, assignment):
    got = owners(assignment)
    wanted = {(t, p) for s in members.values() for t in s.subscribed if t in topics for p in range(topics[t])}
    assert set(got) == wanted
    for (t, _), m in got.items():
        assert t in members[m].subscribed


def moved(before, after):
    """Partitions taken from a member that is still in the group."""
    was = owners(before)
    return sum(1 for tp, m in owners(after).items() if tp in was and was[tp] in after and was[tp] != m)


# ------------------------------------------------------------------------------------------ uniform
def test_uniform_worked_example_gives_the_larger_quota_first_by_member_id():
    members = {"a": spec(T1), "b": spec(T1), "c": spec(T1)}
    out = assign("uniform", members, {T1: 7}, {})
    assert flat(out) == {"a": [("1", 0), ("1", 1), ("1", 2)], "b": [("1", 3), ("1", 4)], "c": [("1", 5), ("1", 6)]}


def test_uniform_joining_member_takes_one_partition_and_nothing_else_moves():
    members = {"a": spec(T1), "b": spec(T1), "c": spec(T1)}
    first = assign("uniform", members, {T1: 7}, {})
    members["d"] = spec(T1)
    second = assign("uniform", members, {T1: 7}, first)
    # 7 over 4: quotas 2,2,2,1; a gave up one partition, the new member got it.
    assert sorted(len(ps) for parts in second.values() for ps in parts.values()) == [1, 2, 2, 2]
    assert moved(first, second) == 1
    assert second["d"] == {T1: {2}}
    assert second["b"] == first["b"] and second["c"] == first["c"]


def test_uniform_leaving_member_moves_only_its_partitions():
    members = {"a": spec(T1), "b": spec(T1), "c": spec(T1)}
    first = assign("uniform", members, {T1: 7}, {})
    del members["b"]
    second = assign("uniform", members, {T1: 7}, first)
    assert second["a"][T1] >= first["a"][T1] and second["c"][T1] >= first["c"][T1]
    assert moved(first, second) == 0
    check_complete(members, {T1: 7}, second)


def test_uniform_keeps_an_assignment_when_nothing_changed():
    members = {m: spec(T1, T2) for m in "abcde"}
    topics = {T1: 12, T2: 5}
    first = assign("uniform", members, topics, {})
    assert assign("uniform", members, topics, first) == first


def test_uniform_different_subscriptions_stay_within_subscriptions_and_balance():
    members = {"a": spec(T1), "b": spec(T1, T2), "c": spec(T2)}
    out = assign("uniform", members, {T1: 3, T2: 3}, {})
    check_complete(members, {T1: 3, T2: 3}, out)
    assert sorted(sum(len(ps) for ps in parts.values()) for parts in out.values()) == [2, 2, 2]


def test_uniform_partitions_of_a_topic_that_grew_go_to_the_least_loaded():
    members = {"a": spec(T1), "b": spec(T1)}
    first = assign("uniform", members, {T1: 2}, {})
    second = assign("uniform", members, {T1: 4}, first)
    assert moved(first, second) == 0
    assert [len(second[m][T1]) for m in "ab"] == [2, 2]


def test_uniform_drops_partitions_of_topics_no_longer_subscribed():
    members = {"a": spec(T1, T2), "b": spec(T1, T2)}
    first = assign("uniform", members, {T1: 2, T2: 2}, {})
    members = {"a": spec(T1), "b": spec(T1)}
    second = assign("uniform", members, {T1: 2, T2: 2}, first)
    check_complete(members, {T1: 2, T2: 2}, second)
    assert all(T2 not in parts for parts in second.values())


@pytest.mark.parametrize("seed", range(20))
def test_uniform_invariants_on_random_groups(seed):
    rng = random.Random(seed)
    topic_ids = [uuid.UUID(int=100 + i) for i in range(rng.randint(1, 5))]
    topics = {t: rng.randint(1, 30) for t in topic_ids}
    homogeneous = seed % 2 == 0
    subs = frozenset(topic_ids)
    members = {f"m{i}": MemberSpec(subs if homogeneous else frozenset(rng.sample(topic_ids, rng.randint(1, len(topic_ids)))))
               for i in range(rng.randint(1, 12))}
    first = assign("uniform", members, topics, {})
    check_complete(members, topics, first)
    if homogeneous:
        counts = [sum(len(ps) for ps in parts.values()) for parts in first.values()]
        assert max(counts) - min(counts) <= 1
    else:
        # No partition could move to a subscriber of its topic and leave both within one.
        load = {m: sum(len(ps) for ps in parts.values()) for m, parts in first.items()}
        for m, parts in first.items():
            for t in parts:
                for other, s in members.items():
                    assert t not in s.subscribed or load[m] - load[other] <= 1, (m, other, load)
    # One member joins: in a homogeneous group only the newcomer's quota moves.
    members["new"] = MemberSpec(subs if homogeneous else frozenset(rng.sample(topic_ids, 1)))
    second = assign("uniform", members, topics, first)
    check_complete(members, topics, second)
    if homogeneous:
        total = sum(topics.values())
        quota = total // len(members)
        assert sum(len(ps) for ps in second["new"].values()) == quota
        assert moved(first, second) == quota   # only the newcomer's quota moves


# ------------------------------------------------------------------------------------------ range
def test_range_worked_example_is_co_partitioned():
    members = {"a": spec(T1, T2), "b": spec(T1, T2), "c": spec(T1, T2)}
    out = assign("range", members, {T1: 7, T2: 7}, {})
    assert out["a"] == {T1: {0, 1, 2}, T2: {0, 1, 2}}
    assert out["b"] == {T1: {3, 4}, T2: {3, 4}}
    assert out["c"] == {T1: {5, 6}, T2: {5, 6}}


def test_range_only_among_subscribers_of_each_topic():
    members = {"a": spec(T1), "b": spec(T1, T2), "c": spec(T2, T3)}
    topics = {T1: 4, T2: 3, T3: 2}
    out = assign("range", members, topics, {})
    check_complete(members, topics, out)
    assert out["a"] == {T1: {0, 1}} and out["b"] == {T1: {2, 3}, T2: {0, 1}} and out["c"] == {T2: {2}, T3: {0, 1}}


def test_range_is_deterministic_and_ignores_the_previous_assignment():
    members = {"a": spec(T1), "b": spec(T1)}
    assert assign("range", members, {T1: 5}, {}) == assign("range", members, {T1: 5}, {"a": {T1: {4}}})


def test_more_members_than_partitions_leaves_some_empty():
    members = {m: spec(T1) for m in "abcd"}
    for name in ("uniform", "range"):
        out = assign(name, members, {T1: 2}, {})
        check_complete(members, {T1: 2}, out)
        assert sorted(len(parts.get(T1, ())) for parts in out.values()) == [0, 0, 1, 1]


def test_unknown_assignor_is_refused():
    with pytest.raises(AssignorError):
        assign("sticky", {"a": spec(T1)}, {T1: 1}, {})
