"""The membership state machine (`odradek.client.group.Membership`) driven by hand: requests out,
responses in, a fake clock (plain numbers), no sockets."""

from __future__ import annotations

import struct

import pytest

from odradek.client.fetcher import TopicPartition as TP
from odradek.client.group import (
    AssignStep, CommitFailedError, FencedInstanceIdError, Membership, PrepareStep, RebalanceInProgressError,
    State, consumer_group_config, decode_assignment, decode_subscription, encode_assignment, encode_subscription,
)
from odradek.protocol.error_codes import ErrorCode as E
from odradek.protocol.messages import find_coordinator as fc
from odradek.protocol.messages import heartbeat as hb
from odradek.protocol.messages import join_group as jg
from odradek.protocol.messages import sync_group as sg

TOPIC = "events"
SESSION, HEARTBEAT, MAX_POLL = 10_000, 1_000, 60_000


def membership(**overrides) -> Membership:
    conf = {"bootstrap.servers": "localhost:9092", "group.id": "g", "session.timeout.ms": SESSION,
            "heartbeat.interval.ms": HEARTBEAT, "max.poll.interval.ms": MAX_POLL,
            "partition.assignment.strategy": "range", **overrides}
    return Membership(consumer_group_config(conf), 0)


def kinds(sends) -> list[str]:
    return [s.kind for s in sends]


def one(m: Membership, now: float, kind: str):
    sends = m.actions(now)
    assert kinds(sends) == [kind], kinds(sends)
    return sends[0]


def find(m: Membership, now: float = 0) -> None:
    send = one(m, now, "find")
    m.on_response(send, fc.FindCoordinatorResponse(coordinators=[fc.Coordinator(
        key="g", node_id=1, host="h", port=9092)]), now)
    assert m.coordinator == (1, "h", 9092)


def prepare(m: Membership, now: float = 0) -> PrepareStep:
    step = m.app_step()
    assert isinstance(step, PrepareStep)
    m.prepared_done(step, now)
    return step


def join_response(send, *, member_id="m-1", generation=1, leader="m-1", members=None, error=0):
    if members is None:
        members = [jg.JoinGroupResponseMember(member_id=member_id, metadata=send.body.protocols[0].metadata)]
    return jg.JoinGroupResponse(error_code=error, generation_id=generation, protocol_name="range", leader=leader,
                                member_id=member_id, members=members if leader == member_id else [])


def stable(m: Membership, now: float = 0, partitions=6, **join) -> list[TP]:
    """subscribe -> prepare -> find -> join (leader unless told) -> assign -> sync -> apply."""
    if m.state is State.UNSUBSCRIBED:
        m.subscribe([TOPIC], now)
    if m.app_step() is not None:
        prepare(m, now)
    if m.coordinator is None:
        find(m, now)
    send = one(m, now, "join")
    m.on_response(send, join_response(send, **join), now)
    if m.state is State.ASSIGNING:
        assert m.partition_counts_needed() == {TOPIC}
        m.assign({TOPIC: partitions}, now)
    sync = one(m, now, "sync")
    mine = [TP(TOPIC, p) for p in range(partitions)]
    m.on_response(sync, sg.SyncGroupResponse(assignment=encode_assignment(mine)), now)
    step = m.app_step()
    assert isinstance(step, AssignStep)
    m.applied(step, now)
    assert m.state is State.STABLE
    return step.assigned


# ------------------------------------------------------------------------------------------ joining
def test_join_waits_for_poll_then_coordinator_then_rejoins_with_the_given_member_id():
    m = membership()
    m.subscribe([TOPIC], 0)
    assert m.actions(0)[0].kind == "find"          # discovery starts at once ...
    m.in_flight.clear()
    find(m)
    assert m.actions(0) == []                      # ... but JoinGroup waits for the application's poll
    assert prepare(m) == PrepareStep()
    send = one(m, 0, "join")
    assert send.body.member_id == "" and send.body.protocol_type == "consumer"
    assert send.timeout_ms >= MAX_POLL + 5000       # the broker holds JoinGroup for the join phase
    assert send.body.rebalance_timeout_ms == MAX_POLL
    m.on_response(send, jg.JoinGroupResponse(error_code=E.MEMBER_ID_REQUIRED, member_id="m-1"), 1)
    again = one(m, 1, "join")
    assert again.body.member_id == "m-1"


def test_leader_assigns_and_sends_every_members_assignment():
    m = membership()
    m.subscribe([TOPIC], 0)
    prepare(m)
    find(m)
    send = one(m, 0, "join")
    other = encode_subscription([TOPIC])
    m.on_response(send, join_response(send, members=[
        jg.JoinGroupResponseMember(member_id="m-1", metadata=send.body.protocols[0].metadata),
        jg.JoinGroupResponseMember(member_id="m-2", metadata=other)]), 0)
    m.assign({TOPIC: 3}, 0)
    sync = one(m, 0, "sync")
    got = {a.member_id: decode_assignment(a.assignment) for a in sync.body.assignments}
    assert got == {"m-1": [TP(TOPIC, 0), TP(TOPIC, 1)], "m-2": [TP(TOPIC, 2)]}
    assert sync.body.generation_id == 1 and sync.body.protocol_name == "range"


def test_follower_syncs_with_no_assignments_and_heartbeats_on_its_interval():
    m = membership()
    stable(m, leader="m-0")
    assert m.actions(HEARTBEAT - 1) == []
    send = one(m, HEARTBEAT, "heartbeat")
    assert (send.body.generation_id, send.body.member_id) == (1, "m-1")
    assert m.actions(HEARTBEAT + 1) == []          # one in flight at a time
    m.on_response(send, hb.HeartbeatResponse(), HEARTBEAT + 5)
    assert m.timeout_ms(HEARTBEAT + 5) == HEARTBEAT - 5


def test_coordinator_loading_and_rebalancing_join_errors_back_off():
    m = membership()
    m.subscribe([TOPIC], 0)
    prepare(m)
    find(m)
    send = one(m, 0, "join")
    m.on_response(send, jg.JoinGroupResponse(error_code=E.COORDINATOR_LOAD_IN_PROGRESS), 0)
    assert m.actions(50) == []
    assert kinds(m.actions(100)) == ["join"]


@pytest.mark.parametrize("code", [E.INCONSISTENT_GROUP_PROTOCOL, E.GROUP_AUTHORIZATION_FAILED,
                                  E.INVALID_SESSION_TIMEOUT, E.GROUP_MAX_SIZE_REACHED])
def test_fatal_join_errors(code):
    m = membership()
    m.subscribe([TOPIC], 0)
    prepare(m)
    find(m)
    send = one(m, 0, "join")
    m.on_response(send, jg.JoinGroupResponse(error_code=code), 0)
    assert m.state is State.FATAL and m.fatal.code == code
    assert m.actions(10_000) == []


# ------------------------------------------------------------------------------------------ heartbeats
def test_rebalance_in_progress_asks_the_application_to_revoke_then_rejoins():
    m = membership()
    owned = stable(m)
    send = one(m, HEARTBEAT, "heartbeat")
    m.on_response(send, hb.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS), HEARTBEAT)
    assert m.rejoin_needed and m.state is State.STABLE
    assert kinds(m.actions(2 * HEARTBEAT)) == ["heartbeat"]   # still a member until poll runs
    m.in_flight.clear()
    step = prepare(m, 2 * HEARTBEAT)
    assert step.revoked == set(owned) and not step.lost   # eager: everything
    join = one(m, 2 * HEARTBEAT + 1, "join")
    assert join.body.member_id == "m-1"
    assert decode_subscription(join.body.protocols[0].metadata).generation_id == 1


@pytest.mark.parametrize("code, member_kept", [(E.ILLEGAL_GENERATION, True), (E.UNKNOWN_MEMBER_ID, False)])
def test_fenced_generation_loses_partitions_and_rejoins(code, member_kept):
    m = membership()
    owned = stable(m)
    send = one(m, HEARTBEAT, "heartbeat")
    m.on_response(send, hb.HeartbeatResponse(error_code=code), HEARTBEAT)
    assert m.state is State.UNJOINED and m.generation == -1
    assert (m.member_id == "m-1") is member_kept
    step = prepare(m, HEARTBEAT)
    assert step.lost == set(owned) and not step.revoked
    join = one(m, HEARTBEAT, "join")
    assert join.body.member_id == ("m-1" if member_kept else "")


def test_fenced_instance_id_is_fatal():
    m = membership(**{"group.instance.id": "i-1"})
    stable(m)
    send = one(m, HEARTBEAT, "heartbeat")
    assert send.body.group_instance_id == "i-1"
    m.on_response(send, hb.HeartbeatResponse(error_code=E.FENCED_INSTANCE_ID), HEARTBEAT)
    assert m.state is State.FATAL and isinstance(m.fatal, FencedInstanceIdError)


def test_not_coordinator_rediscovers_and_heartbeats_resume():
    m = membership()
    stable(m)
    send = one(m, HEARTBEAT, "heartbeat")
    m.on_response(send, hb.HeartbeatResponse(error_code=E.NOT_COORDINATOR), HEARTBEAT)
    assert m.coordinator is None and m.state is State.STABLE
    find(m, HEARTBEAT + 1)
    assert kinds(m.actions(HEARTBEAT + 1)) == ["heartbeat"]


def test_stale_heartbeat_answers_are_ignored():
    m = membership()
    stable(m)
    send = one(m, HEARTBEAT, "heartbeat")
    m.request_rejoin("test")
    prepare(m, HEARTBEAT)
    one(m, HEARTBEAT, "join")
    m.on_response(send, hb.HeartbeatResponse(error_code=E.ILLEGAL_GENERATION), HEARTBEAT)
    assert m.state is State.JOINING and m.generation == 1


def test_session_timeout_without_heartbeat_answers_marks_the_coordinator_unknown():
    m = membership()
    stable(m)
    one(m, HEARTBEAT, "heartbeat")                  # never answered (and not yet timed out)
    assert m.actions(SESSION) == []
    assert kinds(m.actions(SESSION + 1)) == ["find"]
    assert m.coordinator is None


def test_connection_lost_during_join_rejoins_after_rediscovery():
    m = membership()
    m.subscribe([TOPIC], 0)
    prepare(m)
    find(m)
    send = one(m, 0, "join")
    m.on_failure(send, ConnectionError("gone"), 5)
    assert m.state is State.UNJOINED and m.coordinator is None
    find(m, 5)
    assert kinds(m.actions(5)) == ["join"]          # no second PrepareStep: nothing changed


# ------------------------------------------------------------------------------------------ poll timeout, leaving
def test_poll_timeout_leaves_the_group_and_waits_for_the_next_poll():
    m = membership()
    owned = stable(m)
    m.poll(0)
    sends = m.actions(MAX_POLL + 1)
    assert kinds(sends) == ["leave"] and sends[0].body.members[0].member_id == "m-1"
    assert m.state is State.UNJOINED and m.member_id == ""
    assert m.actions(MAX_POLL + 2) == []            # no rejoin until the application polls
    m.poll(MAX_POLL + 10)
    assert prepare(m, MAX_POLL + 10).lost == set(owned)
    assert kinds(m.actions(MAX_POLL + 10)) == ["join"]


def test_static_member_sends_no_leave_on_poll_timeout_or_close():
    m = membership(**{"group.instance.id": "i-1"})
    stable(m)
    assert "leave" not in kinds(m.actions(MAX_POLL + 1))
    m2 = membership(**{"group.instance.id": "i-2"})
    stable(m2)
    assert m2.leave(5) is None and m2.state is State.CLOSED


def test_polling_application_is_not_timed_out():
    m = membership()
    stable(m)
    m.polling = 1
    sends = m.actions(MAX_POLL * 2)
    assert "leave" not in kinds(sends) and m.state is State.STABLE


def test_dynamic_member_leaves_on_close_and_unsubscribe():
    m = membership()
    stable(m)
    send = m.leave(1)
    assert send.kind == "leave" and send.body.member_id == "m-1"
    m2 = membership()
    stable(m2)
    send = m2.unsubscribe(1)
    assert send.kind == "leave" and m2.state is State.UNSUBSCRIBED and m2.member_id == ""


# ------------------------------------------------------------------------------------------ cooperative
def test_cooperative_revokes_only_what_moved_then_asks_for_the_follow_up_rebalance():
    m = membership(**{"partition.assignment.strategy": "cooperative-sticky"})
    m.subscribe([TOPIC], 0)
    prepare(m)
    find(m)
    send = one(m, 0, "join")
    m.on_response(send, jg.JoinGroupResponse(generation_id=1, protocol_name="cooperative-sticky", leader="m-0",
                                             member_id="m-1"), 0)
    sync = one(m, 0, "sync")
    m.on_response(sync, sg.SyncGroupResponse(assignment=encode_assignment([TP(TOPIC, p) for p in range(4)])), 0)
    m.applied(m.app_step(), 0)
    m.request_rejoin("a member joined")
    step = prepare(m, 1)
    assert step.revoked == set() and step.lost == set()   # cooperative: keep everything while joining
    join = one(m, 1, "join")
    sub = decode_subscription(join.body.protocols[0].metadata)
    assert sorted(sub.owned_partitions) == [TP(TOPIC, p) for p in range(4)] and sub.generation_id == 1
    m.on_response(join, jg.JoinGroupResponse(generation_id=2, protocol_name="cooperative-sticky", leader="m-0",
                                             member_id="m-1"), 2)
    sync = one(m, 2, "sync")
    m.on_response(sync, sg.SyncGroupResponse(assignment=encode_assignment([TP(TOPIC, 0), TP(TOPIC, 1)])), 2)
    step = m.app_step()
    assert step.revoked == {TP(TOPIC, 2), TP(TOPIC, 3)} and step.added == set()
    m.applied(step, 2)
    assert m.rejoin_needed                          # the follow-up rebalance
    assert prepare(m, 3) == PrepareStep()
    assert kinds(m.actions(3)) == ["join"]


def test_cooperative_prepare_revokes_topics_no_longer_subscribed():
    m = membership(**{"partition.assignment.strategy": "cooperative-sticky"})
    m.subscribe(["a", "b"], 0)
    prepare(m)
    find(m)
    send = one(m, 0, "join")
    m.on_response(send, jg.JoinGroupResponse(generation_id=1, protocol_name="cooperative-sticky", leader="x",
                                             member_id="m-1"), 0)
    sync = one(m, 0, "sync")
    m.on_response(sync, sg.SyncGroupResponse(assignment=encode_assignment([TP("a", 0), TP("b", 0)])), 0)
    m.applied(m.app_step(), 0)
    m.subscribe(["a"], 1)
    assert m.rejoin_needed
    assert prepare(m, 1).revoked == {TP("b", 0)}


def test_leader_rebalances_when_partition_counts_change():
    m = membership()
    stable(m, partitions=6)
    m.metadata_changed({TOPIC: 6})
    assert not m.rejoin_needed
    m.metadata_changed({TOPIC: 8})
    assert m.rejoin_needed


# ------------------------------------------------------------------------------------------ commits
def test_commit_generation_and_errors():
    m = membership()
    assert m.commit_generation() == (-1, "")        # not subscribed: a simple (assign()) commit
    stable(m)
    assert m.commit_generation() == (1, "m-1")
    assert m.commit_error(E.COORDINATOR_LOAD_IN_PROGRESS, 1) is None
    assert m.commit_error(E.NOT_COORDINATOR, 1) is None and m.coordinator is None
    assert isinstance(m.commit_error(E.REBALANCE_IN_PROGRESS, 1), RebalanceInProgressError)
    assert m.rejoin_needed
    assert isinstance(m.commit_error(E.ILLEGAL_GENERATION, 2), CommitFailedError)
    assert m.state is State.UNJOINED and m.generation == -1
    with pytest.raises(CommitFailedError):
        m.commit_generation()


def test_commit_during_join_is_a_rebalance_in_progress():
    m = membership()
    stable(m)
    m.request_rejoin("x")
    prepare(m, 1)
    one(m, 1, "join")
    with pytest.raises(RebalanceInProgressError):
        m.commit_generation()


# ------------------------------------------------------------------------------------------ codec
def test_subscription_round_trip_and_newer_versions_read_as_v3():
    data = encode_subscription(["b", "a"], [TP("a", 1), TP("a", 0)], 7, "rack-1")
    sub = decode_subscription(data, "inst")
    assert sub.topics == ("a", "b") and sub.owned_partitions == (TP("a", 0), TP("a", 1))
    assert (sub.generation_id, sub.rack_id, sub.group_instance_id) == (7, "rack-1", "inst")
    v9 = struct.pack(">h", 9) + data[2:] + b"fields a future version adds"
    assert decode_subscription(v9) == decode_subscription(data)
    assignment = encode_assignment([TP("a", 2), TP("b", 0)])
    assert decode_assignment(struct.pack(">h", 5) + assignment[2:]) == [TP("a", 2), TP("b", 0)]
    assert decode_assignment(b"") == []
