"""The consumer group protocol's state machine (seed 002, KIP-848): joins, epochs, reconciliation that
revokes before it reassigns, leaves, static members, the errors, timers on a fake clock, offset commits
fenced by member epoch, and replay of the records rebuilding the same groups. Driven through the
synchronous runtime stand-in (`harness.Harness`), which writes real batch bytes."""

import uuid

from odradek.coordinator import admin, consumer_admin, consumer_classic, consumer_heartbeat
from odradek.coordinator.consumer_group import MemberState, TopicsView
from odradek.coordinator.consumer_records import (
    CurrentAssignmentRecord, GroupEpochRecord, MemberRecord, TargetEpochRecord, TargetMemberRecord, TopicMeta,
)
from odradek.coordinator.membership import Caller
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from odradek.protocol.messages.join_group import JoinGroupRequest, JoinGroupRequestProtocol
from odradek.protocol.messages.offset_commit import (
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
)
from tests.unit.coordinator.harness import GROUP, Harness, subscription

G = "cg"
T = uuid.UUID(int=0xA)
U = uuid.UUID(int=0xB)
TOPICS = TopicsView({"orders": TopicMeta(T, 4)})


class Member:
    """One client of the protocol: remembers its epoch and what it owns, as a consumer does."""

    def __init__(self, h: Harness, member_id: str, *, topics=("orders",), regex=None, instance=None,
                 assignor=None, rebalance_ms=30_000, group=G):
        self.h, self.member_id, self.instance, self.group = h, member_id, instance, group
        self.topics, self.regex, self.assignor, self.rebalance_ms = topics, regex, assignor, rebalance_ms
        self.epoch = 0
        self.owned: dict[uuid.UUID, set[int]] = {}

    def request(self, epoch, **kw):
        fields = dict(group_id=self.group, member_id=self.member_id, member_epoch=epoch, instance_id=self.instance)
        fields.update(kw)
        return cgh.ConsumerGroupHeartbeatRequest(**fields)

    def send(self, req, view=TOPICS, version=1):
        return self.h.run(consumer_heartbeat.heartbeat, req, Caller("client", "/127.0.0.1", version), view)

    def join(self, view=TOPICS):
        r = self.send(self.request(0, rebalance_timeout_ms=self.rebalance_ms,
                                   subscribed_topic_names=list(self.topics) if self.topics else None,
                                   subscribed_topic_regex=self.regex, server_assignor=self.assignor,
                                   topic_partitions=[]), view)
        return self._take(r)

    def beat(self, view=TOPICS, *, report=True, epoch=None):
        owned = [cgh.TopicPartitions(topic_id=t, partitions=sorted(ps)) for t, ps in self.owned.items() if ps]
        r = self.send(self.request(self.epoch if epoch is None else epoch,
                                   topic_partitions=owned if report else None), view)
        return self._take(r)

    def leave(self, epoch=-1):
        return self.send(self.request(epoch))

    def _take(self, r):
        if r.error_code == ErrorCode.NONE:
            self.epoch = r.member_epoch
            if r.assignment is not None:   # the consumer revokes and takes what it is told, at once
                self.owned = {tp.topic_id: set(tp.partitions) for tp in r.assignment.topic_partitions}
        return r


def group(h):
    return h.shard.consumer_groups[G]


def assert_single_owners(h, members):
    seen = {}
    for m in members:
        for t, ps in m.owned.items():
            for p in ps:
                assert (t, p) not in seen, f"partition {p} owned by {seen[(t, p)]} and {m.member_id}"
                seen[(t, p)] = m.member_id
    return seen


def settle(h, members, rounds=6):
    for _ in range(rounds):
        for m in members:
            assert m.beat().error_code == ErrorCode.NONE
            assert_single_owners(h, members)


def test_first_member_gets_everything_and_the_records_say_so():
    h = Harness()
    a = Member(h, "a")
    r = a.join()
    assert r.error_code == ErrorCode.NONE and r.member_id == "a" and r.member_epoch == 1
    assert r.heartbeat_interval_ms == 5000
    assert a.owned == {T: {0, 1, 2, 3}}
    kinds = [type(rec) for rec in h.records()]
    assert kinds[0] is MemberRecord and GroupEpochRecord in kinds and TargetMemberRecord in kinds
    assert kinds[-2:] == [TargetEpochRecord, CurrentAssignmentRecord]
    assert group(h).state().value == "Stable"


def test_second_member_waits_until_the_first_revokes_then_both_are_stable():
    h = Harness()
    a, b = Member(h, "a"), Member(h, "b")
    a.join()
    r = b.join()
    assert r.member_epoch == 2 and b.owned == {}            # its partitions are still a's
    assert group(h).members["b"].state == MemberState.UNRELEASED_PARTITIONS
    r = a.beat(report=False)                                # no owned list: cannot know it revoked
    assert r.member_epoch == 1 and sum(map(len, a.owned.values())) == 2
    assert group(h).members["a"].state == MemberState.UNREVOKED_PARTITIONS
    assert b.beat().assignment is None and b.owned == {}    # still not released: a has not said so
    r = a.beat()                                            # a reports it owns only its two
    assert r.member_epoch == 2
    r = b.beat()
    assert r.member_epoch == 2 and sum(map(len, b.owned.values())) == 2
    assert len(assert_single_owners(h, [a, b])) == 4
    assert group(h).state().value == "Stable"


def test_leave_frees_partitions_at_once_and_the_rest_rebalance():
    h = Harness()
    a, b, c = Member(h, "a"), Member(h, "b"), Member(h, "c")
    for m in (a, b, c):
        m.join()
    settle(h, [a, b, c])
    epoch = group(h).group_epoch
    r = b.leave()
    assert r.error_code == ErrorCode.NONE and r.member_epoch == -1
    assert "b" not in group(h).members and group(h).group_epoch == epoch + 1
    settle(h, [a, c])
    assert len(assert_single_owners(h, [a, c])) == 4
    assert b.beat().error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_epoch_checks_fence_members():
    h = Harness()
    a = Member(h, "a")
    a.join()
    assert a.beat(epoch=a.epoch + 1).error_code == ErrorCode.FENCED_MEMBER_EPOCH
    Member(h, "b").join()
    a.beat()
    a.beat()          # a is now at epoch 2, previous 1
    assert a.epoch == 2
    # The previous epoch with a subset of its partitions is a lost response: accepted.
    assert a.beat(epoch=1).error_code == ErrorCode.NONE
    # Rejoining with epoch 0 under a known member id is fenced too (Kafka's rule: the session of the
    # old incarnation must expire first).
    assert a.join().error_code == ErrorCode.FENCED_MEMBER_EPOCH


def test_unknown_member_and_unknown_group():
    h = Harness()
    x = Member(h, "x")
    x.epoch = 3
    assert x.beat().error_code == ErrorCode.GROUP_ID_NOT_FOUND
    Member(h, "a").join()
    assert x.beat().error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_invalid_requests():
    h = Harness()
    a = Member(h, "a")
    assert a.send(a.request(0, rebalance_timeout_ms=1, subscribed_topic_names=["orders"])).error_code \
        == ErrorCode.INVALID_REQUEST                                    # no topic_partitions on join
    assert a.send(a.request(0, rebalance_timeout_ms=1, topic_partitions=[])).error_code \
        == ErrorCode.INVALID_REQUEST                                    # no subscription
    assert Member(h, "").join().error_code == ErrorCode.INVALID_REQUEST  # v1 needs the client's member id
    assert Member(h, "r", topics=(), regex="[").join().error_code == ErrorCode.INVALID_REGULAR_EXPRESSION
    assert Member(h, "s", assignor="sticky").join().error_code == ErrorCode.UNSUPPORTED_ASSIGNOR


def test_v0_join_without_member_id_gets_one_from_the_coordinator():
    h = Harness()
    m = Member(h, "")
    r = m.send(m.request(0, rebalance_timeout_ms=1000, subscribed_topic_names=["orders"], topic_partitions=[]),
               version=0)
    assert r.error_code == ErrorCode.NONE and r.member_id and r.member_id in group(h).members


def test_group_max_size():
    h = Harness(consumer_max_size=1)
    Member(h, "a").join()
    assert Member(h, "b").join().error_code == ErrorCode.GROUP_MAX_SIZE_REACHED


def test_static_member_leaves_temporarily_and_its_successor_takes_its_partitions():
    h = Harness()
    a, b = Member(h, "a", instance="i-a"), Member(h, "b")
    a.join()
    b.join()
    settle(h, [a, b])
    mine = {t: set(ps) for t, ps in a.owned.items()}
    epoch = group(h).group_epoch
    r = a.leave(-2)
    assert r.error_code == ErrorCode.NONE and r.member_epoch == -2
    assert group(h).members["a"].member_epoch == -2
    # The instance is still held: nobody else gets its partitions, and no rebalance happens.
    assert Member(h, "a2", instance="i-a").join().error_code == ErrorCode.NONE
    assert "a" not in group(h).members and group(h).group_epoch == epoch
    successor = group(h).members["a2"]
    assert {t: set(ps) for t, ps in successor.assigned.items()} == mine
    # A third process with the same instance id while a2 is active: refused.
    assert Member(h, "a3", instance="i-a").join().error_code == ErrorCode.UNRELEASED_INSTANCE_ID
    assert Member(h, "zz", instance="i-a").beat(epoch=1).error_code == ErrorCode.FENCED_INSTANCE_ID


def test_session_timeout_removes_a_silent_member_and_others_take_over():
    h = Harness(consumer_session_timeout_ms=45_000)
    a, b = Member(h, "a"), Member(h, "b")
    a.join()
    b.join()
    settle(h, [a, b])
    for _ in range(10):
        h.advance(5_000)
        a.beat()
    assert "b" not in group(h).members
    settle(h, [a])
    assert a.owned == {T: {0, 1, 2, 3}}


def test_member_that_does_not_revoke_in_its_rebalance_timeout_is_fenced():
    h = Harness()
    a = Member(h, "a", rebalance_ms=10_000)
    a.join()
    b = Member(h, "b")
    b.join()
    a.beat(report=False)
    assert group(h).members["a"].state == MemberState.UNREVOKED_PARTITIONS
    h.advance(5_000)
    b.beat()
    assert "a" in group(h).members
    h.advance(6_000)
    assert "a" not in group(h).members
    settle(h, [b])
    assert b.owned == {T: {0, 1, 2, 3}}


def test_regex_subscription_picks_up_a_new_topic():
    h = Harness()
    a = Member(h, "a", topics=(), regex="ord.*")
    a.join()
    assert a.owned == {T: {0, 1, 2, 3}}
    grown = TopicsView({"orders": TopicMeta(T, 4), "ordinals": TopicMeta(U, 2), "other": TopicMeta(uuid.UUID(int=9), 1),
                        "__consumer_offsets": TopicMeta(uuid.UUID(int=8), 50)}, frozenset({"__consumer_offsets"}))
    a.beat(grown)                       # within 10 s of the regex's resolution: not resolved again yet
    assert a.owned == {T: {0, 1, 2, 3}}
    h.advance(10_000)
    a.beat(grown)
    assert a.owned == {T: {0, 1, 2, 3}, U: {0, 1}}
    assert set(group(h).subscription_metadata) == {"orders", "ordinals"}


def test_changing_subscription_revokes_the_dropped_topic():
    h = Harness()
    view = TopicsView({"orders": TopicMeta(T, 2), "users": TopicMeta(U, 2)})
    a = Member(h, "a", topics=("orders", "users"))
    a.join(view)
    assert a.owned == {T: {0, 1}, U: {0, 1}}
    r = a.send(a.request(a.epoch, subscribed_topic_names=["orders"],
                         topic_partitions=[cgh.TopicPartitions(topic_id=t, partitions=sorted(p))
                                           for t, p in a.owned.items()]), view)
    a._take(r)
    assert a.owned == {T: {0, 1}}


def test_offset_commit_is_fenced_by_member_epoch():
    h = Harness()
    a = Member(h, "a")
    a.join()

    def commit(member_id, epoch, version=9):
        req = OffsetCommitRequest(group_id=G, member_id=member_id, generation_id_or_member_epoch=epoch, topics=[
            OffsetCommitRequestTopic(name="orders", partitions=[OffsetCommitRequestPartition(partition_index=0,
                                                                                             committed_offset=5)])])
        response = h.run(consumer_admin.commit_offsets, req, version, lambda name: ErrorCode.NONE)
        return response.topics[0].partitions[0].error_code

    assert commit("a", a.epoch) == ErrorCode.NONE
    assert commit("a", a.epoch - 1) == ErrorCode.STALE_MEMBER_EPOCH
    assert commit("a", a.epoch, version=8) == ErrorCode.UNSUPPORTED_VERSION
    assert commit("nobody", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert commit("", -1) == ErrorCode.UNKNOWN_MEMBER_ID        # members exist: tools may not commit
    assert consumer_admin.fetch_offsets(h.shard, G, "a", a.epoch, [("orders", [0])])[1][0][1][0][1].offset == 5
    assert consumer_admin.fetch_offsets(h.shard, G, "a", a.epoch - 1, None)[0] == ErrorCode.STALE_MEMBER_EPOCH
    a.leave()
    assert commit("", -1) == ErrorCode.NONE


def test_list_describe_and_delete():
    h = Harness()
    a = Member(h, "a")
    a.join()
    listed = consumer_admin.list_groups(h.shard, set(), {"consumer"})
    assert [(g.group_id, g.group_type, g.group_state) for g in listed] == [(G, "consumer", "Stable")]
    assert consumer_admin.list_groups(h.shard, set(), {"classic"}) == []
    d = consumer_admin.describe(h.shard, G, False, TOPICS, ("uniform", "range"))
    assert d.error_code == 0 and d.group_epoch == 1 and d.assignment_epoch == 1 and d.assignor_name == "uniform"
    (m,) = d.members
    assert m.member_epoch == 1 and m.assignment.topic_partitions[0].topic_name == "orders"
    assert m.target_assignment.topic_partitions[0].partitions == [0, 1, 2, 3]
    assert consumer_admin.describe(h.shard, "nope", False, TOPICS, ("uniform",)).error_code \
        == ErrorCode.GROUP_ID_NOT_FOUND
    assert h.run(consumer_admin.delete_group, G) == ErrorCode.NON_EMPTY_GROUP
    a.leave()
    assert h.run(consumer_admin.delete_group, G) == ErrorCode.NONE
    assert G not in h.shard.consumer_groups


def test_replaying_the_records_rebuilds_the_same_groups():
    h = Harness()
    members = [Member(h, n, instance="i-c" if n == "c" else None) for n in "abc"]
    for m in members:
        m.join()
    settle(h, members)
    members[1].leave()
    members[2].leave(-2)
    members[0].beat()
    rebuilt = h.rebuilt()
    assert {g: x.durable_view() for g, x in rebuilt.consumer_groups.items()} \
        == {g: x.durable_view() for g, x in h.shard.consumer_groups.items()}
    assert rebuilt.consumer_groups[G].owners == h.shard.consumer_groups[G].owners


def test_topic_growth_and_deletion_change_the_target():
    h = Harness()
    view = TopicsView({"orders": TopicMeta(T, 2), "users": TopicMeta(U, 1)})
    a = Member(h, "a", topics=("orders", "users"))
    a.join(view)
    assert a.owned == {T: {0, 1}, U: {0}}
    epoch = group(h).group_epoch
    grown = TopicsView({"orders": TopicMeta(T, 3), "users": TopicMeta(U, 1)})
    a.beat(grown)
    assert a.owned == {T: {0, 1, 2}, U: {0}} and group(h).group_epoch == epoch + 1
    deleted = TopicsView({"orders": TopicMeta(T, 3)})
    a.beat(deleted)
    assert a.owned == {T: {0, 1, 2}}
    assert set(group(h).subscription_metadata) == {"orders"}
    # The same name created again is a new topic id: a new partition set.
    recreated = TopicsView({"orders": TopicMeta(T, 3), "users": TopicMeta(uuid.UUID(int=0xC), 2)})
    a.beat(recreated)
    assert a.owned == {T: {0, 1, 2}, uuid.UUID(int=0xC): {0, 1}}


def test_offline_upgrade_and_downgrade_between_classic_and_consumer_groups():
    h = Harness(consumer_migration_policy="disabled")
    (leader,) = h.stable_group(1)
    assert Member(h, "x", group=GROUP).join().error_code == ErrorCode.GROUP_ID_NOT_FOUND   # it has members
    h.commit({("orders", 0): 42}, member_id=leader, generation=h.group.generation)
    h.leave(leader)
    # An Empty classic group becomes a consumer group; its offsets stay.
    m = Member(h, "m", group=GROUP)
    assert m.join().error_code == ErrorCode.NONE
    assert GROUP in h.shard.consumer_groups and h.fetch([("orders", [0])]) == {("orders", 0): 42}
    assert [g.group_type for g in admin.list_groups(h.shard, set(), set())
            + consumer_admin.list_groups(h.shard, set(), set())] == ["consumer"]
    rebuilt = h.rebuilt()
    assert GROUP in rebuilt.consumer_groups and rebuilt.group(GROUP).offsets[("orders", 0)].offset == 42
    # A member of another protocol type cannot join while the consumer group has members ...
    req = JoinGroupRequest(group_id=GROUP, session_timeout_ms=10_000, rebalance_timeout_ms=30_000, member_id="",
                           protocol_type="connect",
                           protocols=[JoinGroupRequestProtocol(name="range", metadata=subscription("orders"))])
    caller = Caller("client", "/127.0.0.1", 5)
    assert h.run(consumer_classic.join_group, req, caller, TOPICS).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # ... and a JoinGroup turns the Empty consumer group back into a classic one.
    m.leave()
    req.protocol_type = "consumer"
    assert h.run(consumer_classic.join_group, req, caller, TOPICS).error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert GROUP not in h.shard.consumer_groups and h.fetch([("orders", [0])]) == {("orders", 0): 42}


def test_offset_delete_refuses_subscribed_topics():
    h = Harness()
    a = Member(h, "a")
    a.join()
    req = OffsetCommitRequest(group_id=G, member_id="a", generation_id_or_member_epoch=a.epoch, topics=[
        OffsetCommitRequestTopic(name=t, partitions=[OffsetCommitRequestPartition(partition_index=0, committed_offset=3)])
        for t in ("orders", "old")])
    h.run(consumer_admin.commit_offsets, req, 9, lambda name: ErrorCode.NONE)
    code, results = h.run(consumer_admin.delete_offsets, G, [("orders", [0]), ("old", [0])], lambda name: ErrorCode.NONE)
    assert code == ErrorCode.NONE
    assert dict(results) == {"orders": [(0, ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)], "old": [(0, ErrorCode.NONE)]}
    assert h.fetch([("orders", [0]), ("old", [0])], group=G) == {("orders", 0): 3, ("old", 0): -1}
