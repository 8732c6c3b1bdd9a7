"""The classic group state machine, driven by requests and a fake clock (milliseconds)."""

from odradek.coordinator.group import GroupState
from odradek.coordinator.records import GroupRecord
from odradek.protocol.error_codes import ErrorCode
from tests.unit.coordinator.harness import Harness, Pending, assignment, subscription

E = ErrorCode


def test_first_join_hands_out_a_member_id_then_the_group_stabilizes():
    h = Harness()
    first = h.join()
    assert first.error_code == E.MEMBER_ID_REQUIRED and first.member_id.startswith("client-")
    assert h.group.state == GroupState.EMPTY and first.member_id in h.group.pending_members
    joined = h.join(first.member_id)
    assert isinstance(joined, Pending)           # the initial delay (0 here) runs as a timer
    h.advance(0)
    r = h.result(joined)
    assert (r.error_code, r.generation_id, r.leader, r.member_id) == (E.NONE, 1, first.member_id, first.member_id)
    assert r.protocol_name == "range" and [m.member_id for m in r.members] == [first.member_id]
    assert h.group.state == GroupState.COMPLETING_REBALANCE
    synced = h.sync(first.member_id, 1, {first.member_id: assignment(t=[0, 1])})
    assert synced.error_code == E.NONE and synced.assignment == assignment(t=[0, 1])
    assert h.group.state == GroupState.STABLE
    (record,) = h.records()
    assert isinstance(record, GroupRecord) and record.value.generation == 1
    assert record.value.members[0].assignment == assignment(t=[0, 1])


def test_old_join_versions_get_a_member_id_at_once():
    h = Harness()
    r = h.join(version=3)
    assert isinstance(r, Pending)
    h.advance(0)
    assert h.result(r).error_code == E.NONE


def test_initial_rebalance_delay_waits_for_more_members_up_to_the_rebalance_timeout():
    h = Harness(initial_rebalance_delay_ms=3000)
    a, ja = h.join_new(rebalance_ms=10_000)
    h.advance(2000)
    b, jb = h.join_new(rebalance_ms=10_000)      # arrives during the delay: the delay is extended
    h.advance(1000)
    assert h.result(ja) is None and h.result(jb) is None
    h.advance(3000)
    ra, rb = h.result(ja), h.result(jb)
    assert ra.generation_id == rb.generation_id == 1
    assert len(ra.members) == 2 and rb.members == []


def test_a_new_member_makes_everyone_rejoin_and_heartbeats_say_so():
    h = Harness()
    (a,) = h.stable_group(1)
    b, jb = h.join_new()
    assert isinstance(jb, Pending) and h.group.state == GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, 1) == E.REBALANCE_IN_PROGRESS
    ja = h.join(a)
    ra, rb = h.result(ja), h.result(jb)
    assert ra.generation_id == rb.generation_id == 2
    assert ra.leader == a and {m.member_id for m in ra.members} == {a, b} and rb.members == []
    sb = h.sync(b, 2)
    assert isinstance(sb, Pending)                # waits for the leader's assignment
    sa = h.sync(a, 2, {a: assignment(t=[0]), b: assignment(t=[1])})
    assert sa.assignment == assignment(t=[0]) and h.result(sb).assignment == assignment(t=[1])
    assert h.heartbeat(a, 2) == h.heartbeat(b, 2) == E.NONE


def test_protocol_is_the_common_one_with_most_votes():
    h = Harness()
    both = (("cooperative-sticky", None), ("range", None))
    a, ja = h.join_new(protocols=both)
    b, jb = h.join_new(protocols=(("range", None), ("cooperative-sticky", None)))
    c, jc = h.join_new(protocols=(("range", None), ("roundrobin", None)))
    h.advance(0)
    assert h.result(ja).protocol_name == "range"   # the only one all three support
    h2 = Harness()
    h2.join_new(protocols=both)
    h2.join_new(protocols=both)
    x, jx = h2.join_new(protocols=(("range", None), ("cooperative-sticky", None)))
    h2.advance(0)
    assert h2.result(jx).protocol_name == "cooperative-sticky"


def test_session_expiry_removes_a_silent_member_and_rebalances():
    h = Harness()
    a, b = h.stable_group(2, session_ms=6000)
    for _ in range(5):
        h.advance(1000)
        assert h.heartbeat(a, 1) == E.NONE
    h.advance(1000)                               # b silent for 6 s: its session expires
    assert b not in h.group.members and h.group.state == GroupState.PREPARING_REBALANCE
    assert h.heartbeat(a, 1) == E.REBALANCE_IN_PROGRESS
    assert h.heartbeat(b, 1) == E.UNKNOWN_MEMBER_ID
    r = h.result(h.join(a))
    assert r.generation_id == 2 and [m.member_id for m in r.members] == [a]


def test_rebalance_timeout_drops_members_that_do_not_rejoin():
    h = Harness()
    a, b = h.stable_group(2, session_ms=30_000, rebalance_ms=5000)
    c, jc = h.join_new(session_ms=30_000, rebalance_ms=5000)
    ja = h.join(a, session_ms=30_000, rebalance_ms=5000)
    h.advance(4999)
    assert h.result(ja) is None
    h.advance(1)                                  # b never rejoined: dropped at the rebalance timeout
    ra, rc = h.result(ja), h.result(jc)
    assert ra.generation_id == rc.generation_id == 2 and b not in h.group.members
    assert h.sync(b, 1).error_code == E.UNKNOWN_MEMBER_ID


def test_members_that_do_not_sync_within_the_rebalance_timeout_are_removed():
    h = Harness()
    a, b = h.stable_group(2, rebalance_ms=5000)
    h.join_new(rebalance_ms=5000)
    ja = h.join(a, rebalance_ms=5000)
    h.join(b, rebalance_ms=5000)
    h.advance(0)
    leader = h.result(ja).leader
    follower = b if leader == a else a
    h.sync(leader, 2, {})
    h.sync(follower, 2)
    h.advance(4999)
    assert len(h.group.members) == 3 and h.group.state == GroupState.STABLE
    h.advance(1)                                  # the third member never sent SyncGroup
    assert set(h.group.members) == {a, b} and h.group.state == GroupState.PREPARING_REBALANCE
    assert h.heartbeat(follower, 2) == E.REBALANCE_IN_PROGRESS


def test_illegal_generation_and_unknown_member():
    h = Harness()
    (a,) = h.stable_group(1)
    assert h.heartbeat(a, 7) == E.ILLEGAL_GENERATION
    assert h.sync(a, 0).error_code == E.ILLEGAL_GENERATION
    assert h.heartbeat("nobody", 1) == E.UNKNOWN_MEMBER_ID
    assert h.sync("nobody", 1).error_code == E.UNKNOWN_MEMBER_ID
    assert h.join("nobody").error_code == E.UNKNOWN_MEMBER_ID
    assert h.join("x", group="no-such-group").error_code == E.UNKNOWN_MEMBER_ID
    assert h.commit({("t", 0): 5}, member_id=a, generation=9)[("t", 0)] == E.ILLEGAL_GENERATION
    assert h.commit({("t", 0): 5}, member_id="nobody", generation=1)[("t", 0)] == E.UNKNOWN_MEMBER_ID


def test_invalid_session_timeout_and_group_id():
    h = Harness(min_session_timeout_ms=6000, max_session_timeout_ms=30_000)
    assert h.join(session_ms=5999).error_code == E.INVALID_SESSION_TIMEOUT
    assert h.join(session_ms=30_001).error_code == E.INVALID_SESSION_TIMEOUT
    assert h.join(group="").error_code == E.INVALID_GROUP_ID


def test_inconsistent_protocols():
    h = Harness()
    (a,) = h.stable_group(1)
    assert h.join(protocol_type="connect").error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.join(protocols=(("roundrobin", None),)).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.join(protocols=(), group="other").error_code == E.INCONSISTENT_GROUP_PROTOCOL
    r = h.sync(a, 1, version=5, protocol_type="consumer", protocol_name="roundrobin")
    assert r.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    r = h.sync(a, 1, version=5, protocol_type="consumer", protocol_name="range")
    assert r.error_code == E.NONE and (r.protocol_type, r.protocol_name) == ("consumer", "range")


def test_group_max_size():
    h = Harness(max_size=2)
    h.stable_group(2)
    r = h.join(version=3)
    assert r.error_code == E.GROUP_MAX_SIZE_REACHED and r.member_id == ""
    assert len(h.group.members) == 2


def test_leave_group_single_and_batched():
    h = Harness()
    a, b, c = h.stable_group(3)
    assert h.leave(c, version=1).error_code == E.NONE
    assert h.group.state == GroupState.PREPARING_REBALANCE and c not in h.group.members
    r = h.leave(b, "nobody")
    assert r.error_code == E.NONE
    assert [(m.member_id, m.error_code) for m in r.members] == [(b, E.NONE), ("nobody", E.UNKNOWN_MEMBER_ID)]
    assert h.leave("x", version=0).error_code == E.UNKNOWN_MEMBER_ID
    ja = h.join(a)
    assert h.result(ja).generation_id == 2
    h.sync(a, 2, {a: assignment(t=[0])})
    assert h.leave(a).error_code == E.NONE       # the last member leaves: the group is empty
    h.advance(0)
    assert h.group.state == GroupState.EMPTY and h.group.generation == 3
    assert h.records()[-1].value.members == [] and h.records()[-1].value.generation == 3


def test_a_stale_join_of_a_removed_member_gets_unknown_member_id():
    h = Harness()
    a, b = h.stable_group(2)
    ja = h.join(a)                                 # a rejoins; b is asked to leave by an admin
    h.leave(b)
    r = h.result(ja)
    assert r.error_code == E.NONE and r.generation_id == 2


def test_static_member_restart_within_session_keeps_its_assignment_without_rebalance():
    h = Harness()
    i1 = h.join(instance="i1")
    h.advance(0)
    r1 = h.result(i1)
    h.sync(r1.member_id, 1, {r1.member_id: assignment(t=[0, 1])})
    old = r1.member_id
    records_before = len(h.records())
    h.advance(3000)
    again = h.join(instance="i1")                  # the process restarted: unknown member id, same instance
    assert again.error_code == E.NONE and again.member_id != old and again.generation_id == 1
    assert h.group.state == GroupState.STABLE and h.group.generation == 1
    assert len(h.records()) == records_before + 1  # the new member id is persisted; no rebalance
    assert h.sync(again.member_id, 1, instance="i1").assignment == assignment(t=[0, 1])
    # The old process, if it still runs, is fenced.
    assert h.heartbeat(old, 1, instance="i1") == E.FENCED_INSTANCE_ID
    assert h.sync(old, 1, instance="i1").error_code == E.FENCED_INSTANCE_ID
    assert h.commit({("t", 0): 1}, member_id=old, generation=1, instance="i1")[("t", 0)] == E.FENCED_INSTANCE_ID
    assert h.join(old, instance="i1").error_code == E.FENCED_INSTANCE_ID
    h.advance(9000)
    assert h.heartbeat(again.member_id, 1, instance="i1") == E.NONE


def test_static_leader_restart_old_and_new_join_versions():
    for version, expect_members in ((5, False), (9, True)):
        h = Harness()
        pa, pb = h.join(instance="a", version=version), h.join(instance="b", version=version)
        h.advance(0)
        ra, rb = h.result(pa), h.result(pb)
        leader = ra.leader
        h.sync(leader, 1, {ra.member_id: assignment(t=[0]), rb.member_id: assignment(t=[1])})
        h.sync(rb.member_id, 1)
        r = h.join(instance="a", version=version)
        assert r.error_code == E.NONE and h.group.state == GroupState.STABLE
        if expect_members:
            assert r.skip_assignment and r.leader == r.member_id and len(r.members) == 2
        else:
            assert r.leader == leader != r.member_id and r.members == [] and not r.skip_assignment


def test_static_member_that_misses_its_session_is_removed():
    h = Harness()
    p = h.join(instance="i1", session_ms=5000)
    h.advance(0)
    m = h.result(p).member_id
    h.sync(m, 1, {m: b""})
    h.advance(5000)
    assert h.group.state == GroupState.EMPTY and h.group.generation == 2


def test_pending_member_id_expires_with_the_session_timeout():
    h = Harness()
    first = h.join(session_ms=4000)
    h.advance(4000)
    assert first.member_id not in h.group.pending_members
    assert h.join(first.member_id).error_code == E.UNKNOWN_MEMBER_ID


def test_leader_failing_to_rejoin_hands_leadership_to_a_member_that_did():
    h = Harness()
    a, b = h.stable_group(2, rebalance_ms=3000, session_ms=30_000)
    c, jc = h.join_new(rebalance_ms=3000, session_ms=30_000)
    jb = h.join(b, rebalance_ms=3000, session_ms=30_000)
    h.advance(3000)
    r = h.result(jb)
    assert r.leader == b and r.generation_id == 2 and a not in h.group.members
    assert {m.member_id for m in r.members} == {b, c} and h.result(jc).members == []


def test_heartbeat_subscription_helper_round_trips():
    assert subscription("a", "b")[:2] == b"\x00\x00"
