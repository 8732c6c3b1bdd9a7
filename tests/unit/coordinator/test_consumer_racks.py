"""Rack changes bump the group epoch (Kafka 3.7+: the subscribed topics' metadata the group compares
includes each partition's replica racks): when a broker comes back with another broker.rack, or a
partition moves to brokers in other racks, a group with members that have a rack id gets a new target
at the next heartbeat; a group without rack ids does not rebalance for it. The racks are in the
partition metadata record (Kafka's PartitionMetadata), so a restarted coordinator does not bump again."""

import uuid

from odradek.coordinator.consumer_group import TopicsView
from odradek.coordinator.consumer_records import SubscriptionMetadataRecord, TopicMeta, decode, encode
from odradek.protocol.error_codes import ErrorCode
from tests.unit.coordinator.harness import Harness
from tests.unit.coordinator.test_consumer_group import G, Member, assert_single_owners, group

T1 = uuid.UUID(int=1)
A, B = frozenset({"A"}), frozenset({"B"})
META = {"orders": TopicMeta(T1, 4)}
BEFORE = TopicsView(dict(META), racks={"orders": (A, B, A, B)})
FLIPPED = TopicsView(dict(META), racks={"orders": (B, A, B, A)})        # the brokers swapped racks
MOVED = TopicsView(dict(META), racks={"orders": (A, B, A, A)})          # partition 3 moved to rack A


class RackMember(Member):
    def __init__(self, h, member_id, rack=None, **kw):
        super().__init__(h, member_id, assignor="range", **kw)
        self.rack = rack

    def join(self, view=BEFORE):
        r = self.send(self.request(0, rebalance_timeout_ms=self.rebalance_ms, subscribed_topic_names=list(self.topics),
                                   rack_id=self.rack, server_assignor=self.assignor, topic_partitions=[]), view)
        return self._take(r)


def settle(h, members, view, rounds=4):
    for _ in range(rounds):
        for m in members:
            assert m.beat(view).error_code == ErrorCode.NONE
            assert_single_owners(h, members)


def joined(h, racks=("A", "B")):
    members = [RackMember(h, name, rack) for name, rack in zip("ab", racks)]
    for m in members:
        assert m.join().error_code == ErrorCode.NONE
    settle(h, members, BEFORE)
    return members


def test_racks_that_change_bump_the_epoch_and_the_target_follows_them():
    h = Harness()
    a, b = joined(h)
    assert group(h).target == {"a": {T1: frozenset({0, 2})}, "b": {T1: frozenset({1, 3})}}
    assert group(h).subscription_metadata["orders"].racks == (("A",), ("B",), ("A",), ("B",))
    epoch = group(h).group_epoch
    settle(h, [a, b], TopicsView(dict(META), racks={"orders": (A, B, A, B)}))   # a new view, the same racks
    assert group(h).group_epoch == epoch
    a.beat(FLIPPED)
    assert group(h).group_epoch == epoch + 1
    assert group(h).target == {"a": {T1: frozenset({1, 3})}, "b": {T1: frozenset({0, 2})}}
    settle(h, [a, b], FLIPPED)
    assert a.owned == {T1: {1, 3}} and b.owned == {T1: {0, 2}} and group(h).state().value == "Stable"
    a.beat(MOVED)                                                            # a reassignment to rack A
    assert group(h).group_epoch == epoch + 2
    assert group(h).subscription_metadata["orders"].racks[3] == ("A",)


def test_a_group_without_rack_ids_does_not_rebalance_for_racks():
    h = Harness()
    a, b = joined(h, racks=(None, None))
    epoch = group(h).group_epoch
    assert group(h).subscription_metadata["orders"].racks == ()
    settle(h, [a, b], FLIPPED)
    settle(h, [a, b], MOVED)
    assert group(h).group_epoch == epoch
    assert not any(isinstance(r, SubscriptionMetadataRecord) and r.topics and r.topics["orders"].racks
                   for r in h.records())


def test_the_racks_are_durable_so_a_restarted_coordinator_does_not_bump_again():
    h = Harness()
    a, b = joined(h)
    rebuilt = h.rebuilt()
    assert rebuilt.consumer_groups[G].subscription_metadata == group(h).subscription_metadata
    assert rebuilt.consumer_groups[G].durable_view() == group(h).durable_view()
    h.shard = rebuilt
    written = len(h.records())
    epoch = group(h).group_epoch
    settle(h, [a, b], TopicsView(dict(META), racks={"orders": (A, B, A, B)}))
    assert group(h).group_epoch == epoch
    assert not any(isinstance(r, SubscriptionMetadataRecord) for r in h.records()[written:])


def test_the_last_member_with_a_rack_leaving_drops_the_racks_without_another_bump():
    h = Harness()
    a, b = joined(h, racks=("A", None))
    assert a.leave().error_code == ErrorCode.NONE
    assert group(h).subscription_metadata["orders"].racks == ()
    epoch = group(h).group_epoch
    settle(h, [b], BEFORE)
    assert group(h).group_epoch == epoch and b.owned == {T1: {0, 1, 2, 3}}


def test_the_partition_metadata_record_carries_the_racks():
    record = SubscriptionMetadataRecord(G, {"orders": TopicMeta(T1, 2, (("A", "B"), ()))})
    key, value = encode(record)
    assert decode(4, key, value) == record
    plain = SubscriptionMetadataRecord(G, {"orders": TopicMeta(T1, 2)})
    assert decode(4, *encode(plain)) == plain
    # A record whose partition list does not cover exactly 0..n-1 reads as no racks (written again later).
    odd = SubscriptionMetadataRecord(G, {"orders": TopicMeta(T1, 3, (("A",), ("B",)))})
    assert decode(4, *encode(odd)).topics["orders"] == TopicMeta(T1, 3)
