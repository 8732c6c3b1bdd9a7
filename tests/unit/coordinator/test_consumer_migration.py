"""Online migration between the classic and the consumer group protocol (seed 002, KIP-848, Kafka's
group.consumer.migration.policy): a live classic group upgraded by the first consumer-protocol member,
classic members living in a consumer group (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit),
and the downgrade when the last consumer-protocol member leaves. At every step no partition is in two
members' hands, as the members themselves see it."""

import uuid

from odradek.coordinator import consumer_admin, consumer_classic, consumer_migration
from odradek.coordinator.consumer_group import MemberState, TopicsView
from odradek.coordinator.consumer_records import TopicMeta
from odradek.coordinator.group import GroupState
from odradek.coordinator.membership import Caller
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages.heartbeat import HeartbeatRequest
from odradek.protocol.messages.join_group import JoinGroupRequest, JoinGroupRequestProtocol
from odradek.protocol.messages.leave_group import LeaveGroupRequest, MemberIdentity
from odradek.protocol.messages.offset_commit import (
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
)
from odradek.protocol.messages.sync_group import SyncGroupRequest
from tests.unit.coordinator.harness import GROUP, Harness, subscription
from tests.unit.coordinator.test_consumer_group import Member

T = uuid.UUID(int=0x7)
VIEW = TopicsView({"t": TopicMeta(T, 4)})
CALLER = Caller("classic", "/127.0.0.1", 5)


class Classic:
    """An eager classic consumer in a consumer group: JoinGroup (owning nothing), SyncGroup, Heartbeat."""

    def __init__(self, h: Harness, member_id: str = "", generation: int = -1, owned=()) -> None:
        self.h, self.member_id, self.generation = h, member_id, generation
        self.owned: set[int] = set(owned)

    def _run(self, op, req, *extra):
        return self.h.run(op, req, CALLER, *extra)

    def join(self):
        self.owned = set()                      # eager: everything is revoked before a rejoin

        def request():
            return JoinGroupRequest(group_id=GROUP, session_timeout_ms=10_000, rebalance_timeout_ms=30_000,
                                    member_id=self.member_id, protocol_type="consumer",
                                    protocols=[JoinGroupRequestProtocol(name="range", metadata=subscription("t"))])
        r = self._run(consumer_classic.join_group, request(), VIEW)
        if r.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = r.member_id
            r = self._run(consumer_classic.join_group, request(), VIEW)
        assert r.error_code == ErrorCode.NONE, r
        assert r.leader == "" and r.members == [] and r.protocol_name == "range"
        self.member_id, self.generation = r.member_id, r.generation_id
        return r

    def sync(self):
        req = SyncGroupRequest(group_id=GROUP, generation_id=self.generation, member_id=self.member_id,
                               protocol_type="consumer", protocol_name="range", assignments=[])
        r = self._run(consumer_classic.sync_group, req, VIEW)
        if r.error_code == ErrorCode.NONE:
            parts = consumer_migration.read_assignment(r.assignment)
            assert all(t == "t" for t, _ in parts)
            self.owned = {p for _, ps in parts for p in ps}
        return r.error_code

    def beat(self):
        req = HeartbeatRequest(group_id=GROUP, generation_id=self.generation, member_id=self.member_id)
        return self._run(consumer_classic.heartbeat, req).error_code

    def rejoin_if_asked(self) -> bool:
        """One heartbeat; on REBALANCE_IN_PROGRESS (or a lost generation) revoke, rejoin and sync."""
        code = self.beat()
        if code == ErrorCode.NONE:
            return False
        assert code in (ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION), code
        self.join()
        assert self.sync() == ErrorCode.NONE
        return True


def owners(consumers, classics) -> dict[int, str]:
    seen: dict[int, str] = {}
    for name, parts in [(m.member_id, m.owned.get(T, set())) for m in consumers] + \
            [(c.member_id, c.owned) for c in classics]:
        for p in parts:
            assert p not in seen, f"partition {p} owned by {seen[p]} and {name}"
            seen[p] = name
    return seen


def settle(h, consumers, classics, rounds: int = 8) -> dict[int, str]:
    for _ in range(rounds):
        for m in consumers:
            assert m.beat(VIEW).error_code == ErrorCode.NONE
            owners(consumers, classics)
        for c in classics:
            c.rejoin_if_asked()
            owners(consumers, classics)
    return owners(consumers, classics)


def upgraded_group(h):
    """A Stable classic group of two eager members (t-0 and t-1), then a consumer member joins."""
    leader, other = h.stable_group(2)
    gen = h.group.generation
    classics = [Classic(h, leader, gen, {0}), Classic(h, other, gen, {1})]
    c = Member(h, "c", topics=("t",), group=GROUP)
    r = c.join(VIEW)
    assert r.error_code == ErrorCode.NONE
    return classics, c, gen


def test_the_first_consumer_member_converts_a_live_classic_group():
    h = Harness()
    classics, c, gen = upgraded_group(h)
    assert h.shard.group(GROUP) is None or not h.shard.group(GROUP).members
    g = h.shard.consumer_groups[GROUP]
    assert g.group_epoch == gen + 1 and set(g.members) == {classics[0].member_id, classics[1].member_id, "c"}
    for cl, p in zip(classics, (0, 1)):
        m = g.members[cl.member_id]
        assert m.uses_classic_protocol and m.member_epoch == gen and m.assigned == {T: frozenset({p})}
    assert c.owned.get(T, set()) <= {2, 3} and owners([c], classics)   # only what no classic member holds
    # The classic members hear of the rebalance on their heartbeat and rejoin, one at a time.
    assert classics[0].beat() == ErrorCode.REBALANCE_IN_PROGRESS
    final = settle(h, [c], classics)
    assert sorted(final) == [0, 1, 2, 3] and len(set(final.values())) == 3
    assert h.shard.consumer_groups[GROUP].state().value == "Stable"
    assert all(cl.beat() == ErrorCode.NONE for cl in classics)
    assert h.rebuilt().consumer_groups[GROUP].durable_view() == h.shard.consumer_groups[GROUP].durable_view()


def commit(h, cl: Classic, generation: int, version: int, offset: int) -> ErrorCode:
    req = OffsetCommitRequest(group_id=GROUP, generation_id_or_member_epoch=generation, member_id=cl.member_id,
                              topics=[OffsetCommitRequestTopic(name="t", partitions=[
                                  OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)])])
    r = h.run(consumer_admin.commit_offsets, req, version, lambda name: ErrorCode.NONE)
    return ErrorCode(r.topics[0].partitions[0].error_code)


def test_classic_members_commit_with_their_generation_at_any_version():
    h = Harness()
    classics, c, _ = upgraded_group(h)
    settle(h, [c], classics)
    cl = classics[0]

    assert commit(h, cl, cl.generation, 2, 5) == ErrorCode.NONE
    assert commit(h, cl, cl.generation - 1, 8, 6) == ErrorCode.ILLEGAL_GENERATION
    assert h.fetch([("t", [0])]) == {("t", 0): 5}


def test_a_classic_member_joins_a_consumer_group_and_waits_for_released_partitions():
    h = Harness()
    a = Member(h, "a", topics=("t",), group=GROUP)
    a.join(VIEW)
    assert a.owned == {T: {0, 1, 2, 3}}
    cl = Classic(h)
    cl.join()
    g = h.shard.consumer_groups[GROUP]
    assert g.members[cl.member_id].state == MemberState.UNRELEASED_PARTITIONS
    assert cl.sync() == ErrorCode.NONE and cl.owned == set()
    assert cl.beat() == ErrorCode.NONE                  # still waiting: a owns them
    a.beat(VIEW)                                        # a is told to revoke two ...
    assert len(a.owned[T]) == 2
    assert cl.beat() == ErrorCode.NONE                  # (not released until a says so)
    a.beat(VIEW)
    assert cl.beat() == ErrorCode.REBALANCE_IN_PROGRESS  # ... which are free now: rejoin to get them
    cl.join()
    assert cl.sync() == ErrorCode.NONE and len(cl.owned) == 2
    assert sorted(owners([a], [cl])) == [0, 1, 2, 3]
    assert cl.beat() == ErrorCode.NONE
    # A SyncGroup at another generation, and from a stranger.
    stale = Classic(h, cl.member_id, cl.generation - 1)
    assert stale.sync() == ErrorCode.ILLEGAL_GENERATION and stale.beat() == ErrorCode.ILLEGAL_GENERATION
    assert Classic(h, "nobody", cl.generation).beat() == ErrorCode.UNKNOWN_MEMBER_ID
    assert Classic(h, "a", a.epoch).beat() == ErrorCode.UNKNOWN_MEMBER_ID   # a consumer-protocol member


def test_classic_leave_group_removes_the_member():
    h = Harness()
    classics, c, _ = upgraded_group(h)
    settle(h, [c], classics)
    epoch = h.shard.consumer_groups[GROUP].group_epoch
    req = LeaveGroupRequest(group_id=GROUP, members=[MemberIdentity(member_id=classics[0].member_id),
                                                     MemberIdentity(member_id="ghost")])
    r = h.run(consumer_classic.leave_group, req, Caller("classic", "/127.0.0.1", 3))
    assert [m.error_code for m in r.members] == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
    g = h.shard.consumer_groups[GROUP]
    assert classics[0].member_id not in g.members and g.group_epoch == epoch + 1
    final = settle(h, [c], classics[1:])
    assert sorted(final) == [0, 1, 2, 3]


def test_the_last_consumer_member_leaving_converts_back_to_a_classic_group_that_rebalances():
    h = Harness()
    classics, c, _ = upgraded_group(h)
    settle(h, [c], classics)
    assert commit(h, classics[0], classics[0].generation, 8, 9) == ErrorCode.NONE
    epoch = h.shard.consumer_groups[GROUP].group_epoch
    c.owned = {}
    assert c.leave().error_code == ErrorCode.NONE
    assert GROUP not in h.shard.consumer_groups
    g = h.group
    assert g.state == GroupState.PREPARING_REBALANCE and g.generation == epoch
    assert set(g.members) == {cl.member_id for cl in classics} and h.fetch([("t", [0])]) == {("t", 0): 9}
    # Every member hears of the rebalance and rejoins as a classic member of a classic group.
    for cl in classics:
        assert cl.beat() in (ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION)
    pending = [h.join(cl.member_id, topics=("t",)) for cl in classics]
    h.advance(0)
    joined = [h.result(p) or p for p in pending]
    assert all(r.error_code == ErrorCode.NONE for r in joined), joined
    assert g.state == GroupState.COMPLETING_REBALANCE and g.generation == epoch + 1
    rebuilt = h.rebuilt()
    assert GROUP not in rebuilt.consumer_groups and rebuilt.group(GROUP).protocol_name == "range"


def test_a_session_expiry_of_the_last_consumer_member_also_downgrades():
    h = Harness()
    classics, c, _ = upgraded_group(h)
    settle(h, [c], classics)
    for _ in range(10):                                 # the classic members keep beating; c is gone
        h.advance(5_000)
        for cl in classics:
            cl.beat()
    assert GROUP not in h.shard.consumer_groups and h.group.state == GroupState.PREPARING_REBALANCE


def test_the_policy_governs_each_direction():
    h = Harness(consumer_migration_policy="downgrade")
    h.stable_group(2)
    assert Member(h, "c", topics=("t",), group=GROUP).join(VIEW).error_code == ErrorCode.GROUP_ID_NOT_FOUND
    h = Harness(consumer_migration_policy="upgrade")
    classics, c, _ = upgraded_group(h)
    settle(h, [c], classics)
    c.owned = {}
    c.leave()
    g = h.shard.consumer_groups[GROUP]                  # no downgrade: the classic members stay
    assert set(g.members) == {cl.member_id for cl in classics}
    final = settle(h, [], classics)
    assert sorted(final) == [0, 1, 2, 3]


def test_a_parked_join_is_told_to_rejoin_when_the_group_is_upgraded():
    h = Harness()
    leader, other = h.stable_group(2)
    pending = h.join(leader, topics=("t",))             # the leader's rejoin starts a rebalance: it waits
    assert h.result(pending) is None
    Member(h, "c", topics=("t",), group=GROUP).join(VIEW)
    assert h.result(pending).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert GROUP in h.shard.consumer_groups
