"""Client-side assignors (the seed's ConsumerGroupPrepareAssignment / InstallAssignment, an odradek
extension behind group.consumer.client.assignors.enable): selection, election of the member that
computes, the prepared group state, the checks on an installed assignment, fallbacks to the server-side
assignor, and replay of what is durable. Driven through the synchronous runtime stand-in."""

import struct
import uuid

from odradek.coordinator import consumer_admin
from odradek.coordinator import consumer_client_assign as cca
from odradek.coordinator.consumer_records import (
    ClientAssignor, MemberRecord, TargetEpochRecord, TargetMemberRecord, decode, encode,
)
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from odradek.protocol.messages import consumer_group_install_assignment as cgi
from odradek.protocol.messages import consumer_group_prepare_assignment as cgp
from tests.unit.coordinator.harness import Harness
from tests.unit.coordinator.test_consumer_group import G, TOPICS, T, Member, assert_single_owners, group

ENABLED = dict(consumer_client_assignors_enable=True)


def assignor(name="sticky", lo=0, hi=1, version=1, reason=0, metadata=b""):
    return cgh.ClientAssignor(name=name, minimum_version=lo, maximum_version=hi, reason=reason, version=version,
                              metadata=metadata)


class ClientMember(Member):
    """A member that declares client-side assignors when it joins."""

    def __init__(self, h, member_id, assignors=(), **kw):
        super().__init__(h, member_id, **kw)
        self.assignors = list(assignors)
        self.computes = False

    def join(self, view=TOPICS):
        r = self.send(self.request(0, rebalance_timeout_ms=self.rebalance_ms, subscribed_topic_names=list(self.topics),
                                   server_assignor=self.assignor, topic_partitions=[],
                                   client_assignors=self.assignors or None), view)
        return self._take(r)

    def beat(self, view=TOPICS, **kw):
        if self.epoch == 0:              # before the first assignment: the member still joins (as ours does)
            return self.join(view)
        return super().beat(view, **kw)

    def _take(self, r):
        r = super()._take(r)
        if r.error_code == ErrorCode.NONE:
            self.computes = r.should_compute_assignment
            self.metadata = None if r.assignment is None else (r.assignment.assignor_metadata_version,
                                                               r.assignment.assignor_metadata)
        return r

    def prepare(self, view=TOPICS):
        return self.h.run(cca.prepare, cgp.ConsumerGroupPrepareAssignmentRequest(
            group_id=G, member_id=self.member_id, member_epoch=self.epoch), view)

    def install(self, group_epoch, assignment, error=0, view=TOPICS, metadata=None):
        members = [cgi.Member(member_id=m, topic_partitions=[cgi.TopicPartitions(topic_id=t, partitions=sorted(ps))
                                                             for t, ps in parts.items()],
                              metadata_version=1 if metadata else -1, metadata_bytes=(metadata or {}).get(m, b""))
                   for m, parts in assignment.items()]
        return self.h.run(cca.install, cgi.ConsumerGroupInstallAssignmentRequest(
            group_id=G, member_id=self.member_id, member_epoch=self.epoch, group_epoch=group_epoch, error=error,
            members=members), view)


def test_select_needs_every_member_and_overlapping_versions():
    def m(*assignors):
        return type("M", (), {"subscription": type("S", (), {"client_assignors": tuple(
            ClientAssignor(n, lo, hi, 0, hi, b"") for n, lo, hi in assignors)})()})()
    assert cca.select({"a": m(("sticky", 0, 2), ("mine", 0, 0)), "b": m(("mine", 0, 0), ("sticky", 1, 3))}) \
        == ("mine", 0)   # ranks tie (0+1 each): the name decides
    assert cca.select({"a": m(("sticky", 0, 2), ("mine", 0, 0)), "b": m(("sticky", 1, 3), ("mine", 0, 0))}) \
        == ("sticky", 2)  # the highest version both read
    assert cca.select({"a": m(("sticky", 0, 0)), "b": m(("sticky", 1, 1))}) is None   # no common version
    assert cca.select({"a": m(("sticky", 0, 1)), "b": m()}) is None                    # b: server-side only
    assert cca.select({}) is None


def test_the_elected_member_prepares_and_installs_and_everyone_reconciles():
    h = Harness(**ENABLED)
    a = ClientMember(h, "a", [assignor(metadata=b"from-a")])
    r = a.join()
    assert r.error_code == ErrorCode.NONE and r.should_compute_assignment
    assert r.member_epoch == 0 and a.owned == {}                  # no target yet: nothing assigned
    assert group(h).group_epoch == 1 and group(h).assignment_epoch == 0
    b = ClientMember(h, "b", [assignor(metadata=b"from-b")])
    assert not b.join().should_compute_assignment                  # a stays elected
    assert a.beat().should_compute_assignment                      # told again until it installs
    p = a.prepare()
    assert p.error_code == ErrorCode.NONE and p.group_epoch == 2
    assert (p.assignor_name, p.assignor_version) == ("sticky", 1)
    assert [(m.member_id, m.subscribed_topic_ids, bytes(m.assignor_metadata)) for m in p.members] == \
        [("a", [T], b"from-a"), ("b", [T], b"from-b")]
    assert [(t.topic_id, t.topic_name, t.num_partitions) for t in p.topics] == [(T, "orders", 4)]
    r = a.install(2, {"a": {T: {0, 3}}, "b": {T: {1, 2}}}, metadata={"a": b"for-a", "b": b"for-b"})
    assert r.error_code == ErrorCode.NONE
    assert group(h).assignment_epoch == 2 and group(h).target["b"] == {T: frozenset({1, 2})}
    r = a.beat()
    assert not r.should_compute_assignment and r.member_epoch == 2 and a.owned == {T: {0, 3}}
    assert a.metadata == (1, b"for-a")
    b.beat()
    assert b.owned == {T: {1, 2}} and b.metadata == (1, b"for-b")
    assert len(assert_single_owners(h, [a, b])) == 4
    assert group(h).state().value == "Stable"
    # What is durable replays: the members' assignors and the targets with their metadata.
    assert h.rebuilt().consumer_groups[G].durable_view() == group(h).durable_view()
    members = [r for r in h.records() if isinstance(r, MemberRecord) and r.value is not None]
    assert members[0].value.client_assignors == (ClientAssignor("sticky", 0, 1, 0, 1, b"from-a"),)
    assert any(isinstance(r, TargetMemberRecord) and r.metadata == (1, b"for-b") for r in h.records())


def test_install_checks_member_epoch_election_and_assignment():
    h = Harness(**ENABLED)
    a, b = ClientMember(h, "a", [assignor()]), ClientMember(h, "b", [assignor()])
    a.join()
    b.join()
    epoch = a.prepare().group_epoch
    assert b.prepare().error_code == ErrorCode.INVALID_REQUEST              # not elected
    assert b.install(epoch, {"b": {T: {0}}}).error_code == ErrorCode.INVALID_REQUEST
    c = ClientMember(h, "c", [assignor()])
    c.epoch = 0
    assert c.prepare().error_code == ErrorCode.UNKNOWN_MEMBER_ID
    bad = ClientMember(h, "a")
    bad.epoch = 7
    assert bad.prepare().error_code == ErrorCode.FENCED_MEMBER_EPOCH
    for assignment, why in [({"a": {T: {0}}, "b": {T: {0}}}, "assigned to a and b"), ({"a": {T: {4}}}, "does not exist"),
                            ({"zz": {T: {1}}}, "not a member"), ({"a": {uuid.UUID(int=99): {0}}}, "not subscribed")]:
        r = a.install(epoch, assignment)
        assert r.error_code == ErrorCode.INVALID_REQUEST and why in r.error_message
    assert a.install(epoch + 1, {"a": {T: {0}}}).error_code == ErrorCode.ILLEGAL_GENERATION   # from the future
    assert a.install(epoch, {"a": {T: {0, 1, 2, 3}}}).error_code == ErrorCode.NONE
    assert a.install(epoch, {"a": {T: {0}}}).error_code == ErrorCode.INVALID_REQUEST         # no longer elected
    assert group(h).target == {"a": {T: frozenset({0, 1, 2, 3})}, "b": {}}


def test_a_member_without_client_assignors_makes_the_server_assign():
    h = Harness(**ENABLED)
    a = ClientMember(h, "a", [assignor()])
    a.join()
    assert a.computes
    lib = ClientMember(h, "lib")                                  # librdkafka: server-side only
    r = lib.join()
    assert not r.should_compute_assignment and group(h).assignment_epoch == group(h).group_epoch
    assert sum(len(ps) for ps in lib.owned.values()) == 2 and cca.elected(h.shard, G, "a") is False
    a.beat()
    a.beat()
    lib.beat()
    assert len(assert_single_owners(h, [a, lib])) == 4
    lib.leave()                                                   # back to the client-side assignor
    assert a.beat().should_compute_assignment
    r = a.install(a.prepare().group_epoch, {"a": {T: {0, 1, 2, 3}}})
    assert r.error_code == ErrorCode.NONE
    a.beat()
    assert a.owned == {T: {0, 1, 2, 3}}


def test_a_failed_assignor_falls_back_to_the_server_assignor():
    h = Harness(**ENABLED)
    a, b = ClientMember(h, "a", [assignor()]), ClientMember(h, "b", [assignor()])
    a.join()
    b.join()
    epoch = a.prepare().group_epoch
    assert a.install(epoch, {}, error=1).error_code == ErrorCode.NONE
    assert group(h).assignment_epoch == group(h).group_epoch
    assert sorted(sum(len(ps) for ps in t.values()) for t in group(h).target.values()) == [2, 2]


def test_an_election_times_out_and_an_install_for_an_older_epoch_still_counts():
    h = Harness(**ENABLED)
    a = ClientMember(h, "a", [assignor()], rebalance_ms=10_000)
    b = ClientMember(h, "b", [assignor()], rebalance_ms=10_000)
    a.join()
    b.join()
    h.advance(10_001)
    assert b.beat().should_compute_assignment                     # a took too long: b is elected
    assert a.install(2, {"a": {T: {0}}}).error_code == ErrorCode.INVALID_REQUEST
    epoch = b.prepare().group_epoch
    c = ClientMember(h, "c", [assignor()])
    c.join()                                                      # the group epoch moves on meanwhile
    assert b.install(epoch, {"a": {T: {0, 1}}, "b": {T: {2, 3}}}).error_code == ErrorCode.NONE
    assert group(h).assignment_epoch == epoch < group(h).group_epoch
    assert c.beat().should_compute_assignment                     # the next heartbeat elects again
    assert group(h).target["c"] == {}


def test_disabled_the_client_assignors_are_ignored():
    h = Harness()
    a = ClientMember(h, "a", [assignor()])
    r = a.join()
    assert not r.should_compute_assignment and a.owned == {T: {0, 1, 2, 3}}
    assert group(h).members["a"].subscription.client_assignors == ()


def test_invalid_client_assignors_are_refused():
    h = Harness(**ENABLED)
    for bad in ([assignor(name="")], [assignor(), assignor()], [assignor(lo=2, hi=1)]):
        assert ClientMember(h, "a", bad).join().error_code == ErrorCode.INVALID_REQUEST


def test_new_metadata_from_a_member_bumps_the_group_epoch():
    h = Harness(**ENABLED)
    a = ClientMember(h, "a", [assignor(metadata=b"1")])
    a.join()
    a.install(a.prepare().group_epoch, {"a": {T: {0, 1, 2, 3}}})
    a.beat()
    before = group(h).group_epoch
    r = a.send(a.request(a.epoch, client_assignors=[assignor(metadata=b"2", reason=1)]))
    assert r.should_compute_assignment and group(h).group_epoch == before + 1


def _described_assignor(h):
    return consumer_admin.describe(h.shard, G, False, TOPICS, h.shard.config.consumer_assignors).assignor_name


def test_describe_names_the_assignor_that_computed_the_target():
    h = Harness(**ENABLED)
    a, b = ClientMember(h, "a", [assignor("weighted")]), ClientMember(h, "b", [assignor("weighted")])
    a.join()
    b.join()
    assert _described_assignor(h) == "uniform"                    # no target from a client assignor yet
    assert a.install(a.prepare().group_epoch, {"a": {T: {0, 1}}, "b": {T: {2, 3}}}).error_code == ErrorCode.NONE
    assert _described_assignor(h) == "weighted"
    (record,) = [r for r in h.records() if isinstance(r, TargetEpochRecord) and r.assignor is not None]
    assert record.assignor == "weighted"
    rebuilt = Harness(**ENABLED)
    rebuilt.shard = h.rebuilt()
    assert _described_assignor(rebuilt) == "weighted"             # durable: the target epoch record says so
    lib = ClientMember(h, "lib", assignor="range")                # no client assignors: the server assigns
    lib.join()
    assert group(h).assignment_epoch == group(h).group_epoch and _described_assignor(h) == "range"
    lib.leave()
    assert a.beat().should_compute_assignment
    assert a.install(a.prepare().group_epoch, {}, error=1).error_code == ErrorCode.NONE   # the assignor failed
    assert _described_assignor(h) == "uniform"                    # the server-side assignor computed it


def test_the_target_epoch_record_keeps_kafkas_bytes_without_a_client_assignor():
    key, value = encode(TargetEpochRecord("g", 3))
    assert value == struct.pack(">hi", 0, 3) + bytes([0])         # v0, flexible, no tagged fields
    assert decode(6, key, value) == TargetEpochRecord("g", 3)
    key, value = encode(TargetEpochRecord("g", 3, "weighted"))
    assert value.startswith(struct.pack(">hi", 0, 3)) and b"weighted" in value
    assert decode(6, key, value) == TargetEpochRecord("g", 3, "weighted")
