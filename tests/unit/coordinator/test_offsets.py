"""Committed offsets, their retention, and group administration."""

import pytest

from odradek.coordinator import admin
from odradek.coordinator import offsets as offs
from odradek.coordinator.group import GroupState, parse_subscription
from odradek.coordinator.records import OffsetRecord
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from tests.unit.coordinator.harness import GROUP, Harness, assignment, subscription

E = ErrorCode


def test_member_commits_and_anyone_fetches():
    h = Harness()
    (a,) = h.stable_group(1)
    errors = h.commit({("t", 0): 10, ("t", 1): 20}, member_id=a, generation=1, metadata="m")
    assert set(errors.values()) == {E.NONE}
    assert h.fetch([("t", [0, 1, 2])]) == {("t", 0): 10, ("t", 1): 20, ("t", 2): -1}
    assert h.fetch(None) == {("t", 0): 10, ("t", 1): 20}
    assert h.fetch(None, group="other") == {}
    assert [r.value.offset for r in h.records() if isinstance(r, OffsetRecord)] == [10, 20]
    assert h.group.offsets[("t", 0)].metadata == "m"


def test_commits_from_outside_the_group():
    h = Harness()
    assert h.commit({("t", 0): 5}) == {("t", 0): E.NONE}           # simple consumer, no group yet
    assert h.group.state == GroupState.EMPTY and h.group.protocol_type is None
    assert h.commit({("t", 0): 6}, generation=3, group="nope") == {("t", 0): E.ILLEGAL_GENERATION}
    h2 = Harness()
    h2.stable_group(1)
    assert h2.commit({("t", 0): 5}) == {("t", 0): E.UNKNOWN_MEMBER_ID}   # active group: refused


def test_commit_checks_metadata_size_and_topics():
    h = Harness(offset_metadata_max_bytes=4)
    errors = h.commit({("t", 0): 1, ("gone", 0): 1}, metadata="abcd", unknown_topics={"gone"})
    assert errors == {("t", 0): E.NONE, ("gone", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert h.commit({("t", 0): 2}, metadata="abcde") == {("t", 0): E.OFFSET_METADATA_TOO_LARGE}
    assert h.fetch([("t", [0])]) == {("t", 0): 1}


def test_commit_during_rebalance():
    h = Harness()
    a, b = h.stable_group(2)
    h.join_new()                                        # PreparingRebalance: old generation may commit
    assert h.commit({("t", 0): 3}, member_id=a, generation=1) == {("t", 0): E.NONE}
    h.join(a), h.join(b)
    assert h.group.state == GroupState.COMPLETING_REBALANCE
    assert h.commit({("t", 0): 4}, member_id=a, generation=2) == {("t", 0): E.REBALANCE_IN_PROGRESS}
    assert h.commit({("t", 0): 4}, member_id=a, generation=1) == {("t", 0): E.ILLEGAL_GENERATION}


def test_commit_v1_timestamp_and_v2_retention():
    h = Harness()
    h.commit({("t", 0): 1}, version=2, retention_ms=5000)
    assert h.group.offsets[("t", 0)].expire_timestamp_ms == h.now + 5000
    rebuilt = h.rebuilt()
    assert rebuilt.group(GROUP).offsets == h.group.offsets       # written as OffsetCommitValue v1


def test_offsets_of_an_empty_group_expire_after_retention_and_the_group_goes():
    h = Harness(offsets_retention_ms=60_000, offsets_retention_check_interval_ms=10_000)
    h.shard.schedule(("offsets-retention",), h.now + 10_000)
    (a,) = h.stable_group(1)
    h.commit({("t", 0): 1}, member_id=a, generation=1)
    h.commit({("other", 0): 1}, member_id=a, generation=1)
    for _ in range(20):
        assert h.heartbeat(a, 1) == E.NONE                       # stable, subscribed to t only
        h.advance(5_000)
    assert ("t", 0) in h.group.offsets and ("other", 0) not in h.group.offsets
    h.leave(a)
    h.advance(0)
    assert h.group.state == GroupState.EMPTY
    h.advance(50_000)
    assert h.group is not None
    h.advance(20_000)
    assert h.group is None and h.rebuilt().group(GROUP) is None


def test_simple_group_offsets_expire_from_their_commit_time():
    h = Harness(offsets_retention_ms=60_000, offsets_retention_check_interval_ms=1_000)
    h.shard.schedule(("offsets-retention",), h.now + 1_000)
    h.commit({("t", 0): 1})
    h.advance(30_000)
    h.commit({("t", 1): 1})
    h.advance(31_000)
    assert set(h.group.offsets) == {("t", 1)}
    h.advance(30_000)
    assert h.group is None


def test_offset_delete():
    h = Harness()
    a, b = h.stable_group(2, topics=("t",))
    h.commit({("t", 0): 1, ("u", 0): 2}, member_id=a, generation=1)
    out = offs.delete_offsets(h.shard, GROUP, [("t", [0]), ("u", [0, 1])], lambda t: E.NONE, h.now)
    h.apply(out)
    code, results = out.response
    assert code == E.NONE and results == [("t", [(0, E.GROUP_SUBSCRIBED_TO_TOPIC)]), ("u", [(0, E.NONE), (1, E.NONE)])]
    assert h.fetch(None) == {("t", 0): 1}
    assert offs.delete_offsets(h.shard, "nope", [], lambda t: E.NONE, h.now).response[0] == E.GROUP_ID_NOT_FOUND


def test_describe_list_and_delete_groups():
    h = Harness()
    a, b = h.stable_group(2)
    d = admin.describe_group(h.shard, GROUP, True)
    assert (d.group_state, d.protocol_type, d.protocol_data) == ("Stable", "consumer", "range")
    assert [m.member_assignment for m in d.members] == [assignment(t=[0]), assignment(t=[1])]
    assert d.authorized_operations == 328
    assert admin.describe_group(h.shard, "nope", False).group_state == "Dead"
    h.commit({("t", 0): 1})                                   # a simple group on the same shard
    assert [(g.group_id, g.group_state) for g in admin.list_groups(h.shard, set(), set())] == \
        [(GROUP, "Stable")]
    h.commit({("t", 0): 1}, group="simple")
    assert [g.group_id for g in admin.list_groups(h.shard, {"empty"}, set())] == ["simple"]
    assert admin.list_groups(h.shard, set(), {"consumer"}) == []
    assert h.run(admin.delete_group, GROUP) == E.NON_EMPTY_GROUP
    h.leave(a, b)
    h.advance(0)
    h.commit({("t", 0): 9})
    assert h.run(admin.delete_group, GROUP) == E.NONE
    assert h.group is None and h.fetch(None) == {}
    assert h.run(admin.delete_group, GROUP) == E.GROUP_ID_NOT_FOUND
    assert h.rebuilt().durable_view() == h.shard.durable_view()


def test_subscriptions_are_read_by_their_v0_prefix():
    """Some clients declare ConsumerProtocolSubscription v1 but send the v0 layout (COMPAT-NOTES); Kafka
    reads every version by its v0 prefix, so such a group's subscription is known."""
    v0_layout_declared_v1 = (1).to_bytes(2, "big") + (0).to_bytes(4, "big") + (-1).to_bytes(4, "big", signed=True)
    assert parse_subscription(v0_layout_declared_v1) == []
    assert parse_subscription((1).to_bytes(2, "big") + subscription("a", "b")[2:]) == ["a", "b"]
    assert parse_subscription((9).to_bytes(2, "big") + subscription("x")[2:] + b"future fields") == ["x"]
    with pytest.raises(ProtocolError):
        parse_subscription((-1).to_bytes(2, "big", signed=True) + subscription("x")[2:])
    h = Harness()
    a, = h.stable_group(1, protocols=(("range", v0_layout_declared_v1),))
    h.commit({("t", 0): 1}, member_id=a, generation=1)
    out = offs.delete_offsets(h.shard, GROUP, [("t", [0])], lambda t: E.NONE, h.now)
    h.apply(out)
    assert out.response == (E.NONE, [("t", [(0, E.NONE)])])     # subscribed to nothing: deletable
    assert h.fetch(None) == {}
