"""The consumer protocol's membership (group.protocol=consumer; seed 002, KIP-848), sans I/O, driven by
hand against the real coordinator state machine (`coordinator.consumer_heartbeat` on a shard): join with
epoch 0, reconcile revoking before acquiring, acknowledge, fencing, static leave, commit epochs."""

import uuid

from odradek.client.fetcher import TopicPartition
from odradek.client.group import AssignStep, PrepareStep, State, consumer_group_config
from odradek.client.group_consumer import ConsumerMembership
from odradek.coordinator import consumer_heartbeat
from odradek.coordinator.consumer_group import TopicsView
from odradek.coordinator.consumer_records import TopicMeta
from odradek.coordinator.membership import Caller
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from odradek.protocol.messages import find_coordinator as fc
from tests.unit.coordinator.harness import Harness

T = uuid.UUID(int=0x42)
VIEW = TopicsView({"t": TopicMeta(T, 4)})
NAMES = {T: "t"}


def member(**config) -> ConsumerMembership:
    c = consumer_group_config({"bootstrap.servers": "h:1", "group.id": "g", "group.protocol": "consumer", **config})
    m = ConsumerMembership(c, 0, NAMES.get)
    m.subscribe({"t"}, 0)
    m.on_response(m.actions(0)[0], fc.FindCoordinatorResponse(error_code=0, node_id=1, host="h", port=1), 0)
    return m


class Loop:
    """Sends a membership's heartbeats to a coordinator shard and runs its application steps."""

    def __init__(self) -> None:
        self.h = Harness()
        self.now = 0.0

    def beat(self, m: ConsumerMembership) -> cgh.ConsumerGroupHeartbeatResponse | None:
        sends = [s for s in m.actions(self.now + 10_000) if s.kind in ("heartbeat", "leave")]
        if not sends:
            return None
        (send,) = sends
        r = self.h.run(consumer_heartbeat.heartbeat, send.body, Caller("c", "/h", 1), VIEW)
        m.on_response(send, r, self.now)
        return r

    @staticmethod
    def apply(m: ConsumerMembership) -> PrepareStep | AssignStep | None:
        step = m.app_step()
        if isinstance(step, AssignStep):
            m.applied(step, 0)
        elif isinstance(step, PrepareStep):
            m.prepared_done(step, 0)
        return step


def owners(*members: ConsumerMembership) -> set[TopicPartition]:
    seen: set[TopicPartition] = set()
    for m in members:
        assert not seen & m.owned, f"{seen & m.owned} owned twice"
        seen |= m.owned
    return seen


def test_join_share_and_leave():
    loop = Loop()
    a, b = member(), member()
    r = loop.beat(a)
    assert r.error_code == ErrorCode.NONE and a.member_epoch == 1 and a.state is State.ASSIGNED
    assert a.in_flight == {}
    step = loop.apply(a)
    assert step.added == {TopicPartition("t", p) for p in range(4)} and a.state is State.STABLE
    loop.beat(b)
    loop.apply(b)
    assert b.owned == set()                             # nothing is free yet
    loop.beat(a)                                        # a is told to give two up ...
    step = loop.apply(a)
    assert isinstance(step, AssignStep) and len(step.revoked) == 2 and not step.added
    assert a.commit_generation() == (a.member_epoch, a.member_id)
    for _ in range(3):                                  # ... acknowledges, and b gets them
        loop.beat(a), loop.apply(a), loop.beat(b), loop.apply(b)
        owners(a, b)
    assert len(a.owned) == len(b.owned) == 2 and owners(a, b) == {TopicPartition("t", p) for p in range(4)}
    assert a.member_epoch == b.member_epoch == loop.h.shard.consumer_groups["g"].group_epoch
    leave = a.leave(0)
    assert leave.body.member_epoch == -1 and a.state is State.CLOSED
    loop.h.run(consumer_heartbeat.heartbeat, leave.body, Caller("c", "/h", 1), VIEW)
    for _ in range(2):
        loop.beat(b), loop.apply(b)
    assert len(b.owned) == 4


def test_fenced_member_loses_its_partitions_and_joins_again_with_the_same_id():
    loop = Loop()
    a = member()
    loop.beat(a), loop.apply(a)
    member_id = a.member_id
    send = [s for s in a.actions(10_000) if s.kind == "heartbeat"][0]
    a.on_response(send, cgh.ConsumerGroupHeartbeatResponse(error_code=ErrorCode.FENCED_MEMBER_EPOCH), 0)
    assert a.member_epoch == 0 and a.state is State.UNJOINED
    step = loop.apply(a)
    assert isinstance(step, PrepareStep) and len(step.lost) == 4 and a.owned == set()
    join = [s for s in a.actions(20_000) if s.kind == "heartbeat"][0]
    assert join.body.member_epoch == 0 and join.body.member_id == member_id and join.body.topic_partitions == []


def test_static_member_leaves_with_minus_two_and_fatal_errors_stop_it():
    a = member(**{"group.instance.id": "i-1", "group.remote.assignor": "range"})
    join = [s for s in a.actions(0) if s.kind == "heartbeat"][0]
    assert join.body.instance_id == "i-1" and join.body.server_assignor == "range"
    a.on_response(join, cgh.ConsumerGroupHeartbeatResponse(error_code=0, member_id=a.member_id, member_epoch=3,
                                                            heartbeat_interval_ms=100), 0)
    assert a.leave(0).body.member_epoch == -2
    b = member()
    join = [s for s in b.actions(0) if s.kind == "heartbeat"][0]
    b.on_response(join, cgh.ConsumerGroupHeartbeatResponse(error_code=ErrorCode.UNSUPPORTED_ASSIGNOR), 0)
    assert b.state is State.FATAL and b.fatal is not None


def test_pattern_subscription_sends_the_regex_once():
    import re
    a = member()
    a.set_pattern(re.compile("t.*"))
    join = [s for s in a.actions(0) if s.kind == "heartbeat"][0]
    assert join.body.subscribed_topic_regex == "t.*" and join.body.subscribed_topic_names == []
    a.on_response(join, cgh.ConsumerGroupHeartbeatResponse(error_code=0, member_id=a.member_id, member_epoch=1,
                                                            heartbeat_interval_ms=100), 0)
    nxt = [s for s in a.actions(1000) if s.kind == "heartbeat"][0]
    assert nxt.body.subscribed_topic_regex is None and nxt.body.subscribed_topic_names is None
