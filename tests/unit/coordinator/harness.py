"""A synchronous stand-in for the coordinator runtime with a fake clock in milliseconds.

It does what `runtime.GroupCoordinator` does around an operation (park, append, replay, complete) but
appends to a list of batch bytes built by the real `records.build_batch`, so replay tests read the
exact bytes the broker would write. `advance(ms)` moves the clock and fires due timers in order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from odradek.coordinator import membership as mem
from odradek.coordinator import offsets as offs
from odradek.coordinator.membership import Caller
from odradek.coordinator.records import build_batch, iter_batches
from odradek.coordinator.shard import GroupConfig, GroupShard, Outcome
from odradek.protocol.api import encode_record
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_protocol_assignment as cpa
from odradek.protocol.messages import consumer_protocol_subscription as cps
from odradek.protocol.messages.heartbeat import HeartbeatRequest
from odradek.protocol.messages.join_group import JoinGroupRequest, JoinGroupRequestProtocol
from odradek.protocol.messages.leave_group import LeaveGroupRequest, MemberIdentity
from odradek.protocol.messages.offset_commit import (
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
)
from odradek.protocol.messages.sync_group import SyncGroupRequest, SyncGroupRequestAssignment

GROUP = "g"
DEFAULTS = dict(min_session_timeout_ms=1000, max_session_timeout_ms=60000, initial_rebalance_delay_ms=0,
                offsets_retention_ms=60_000, offsets_retention_check_interval_ms=10_000)


def subscription(*topics: str) -> bytes:
    return encode_record("ConsumerProtocolSubscription", 0, cps.ConsumerProtocolSubscription(topics=list(topics)))


def assignment(**topics: list[int]) -> bytes:
    return encode_record("ConsumerProtocolAssignment", 0, cpa.ConsumerProtocolAssignment(
        assigned_partitions=[cpa.TopicPartition(topic=t, partitions=ps) for t, ps in topics.items()]))


@dataclass
class Pending:
    key: tuple


class Harness:
    def __init__(self, **config) -> None:
        self.now = 1_000_000
        ids = itertools.count(1)
        self.shard = GroupShard(0, GroupConfig(**{**DEFAULTS, **config}), new_uuid=lambda: f"u{next(ids)}")
        self.batches: list[bytes] = []
        self.done: dict[tuple, object] = {}
        self.parked: set[tuple] = set()

    # ---------------------------------------------------------------------------- runtime
    def apply(self, out: Outcome) -> None:
        if out.records:
            self.batches.append(build_batch(out.records, self.now))
            for r in out.records[out.replayed:]:
                self.shard.replay(r, self.now)
        for key, response in out.completions:
            if key in self.parked:
                self.parked.discard(key)
                self.done[key] = response

    def run(self, op, *args):
        out = op(self.shard, *args, self.now)
        if out.park is not None:
            self.parked.add(out.park)
        self.apply(out)
        if out.park is None:
            return out.response
        return self.done.pop(out.park) if out.park in self.done else Pending(out.park)

    def result(self, pending):
        """The answer a parked request got, or None while it still waits."""
        return self.done.pop(pending.key, None) if isinstance(pending, Pending) else pending

    def advance(self, ms: int) -> None:
        end = self.now + ms
        while True:
            deadline = self.shard.next_deadline()
            if deadline is None or deadline > end:
                break
            self.now = max(self.now, deadline)
            for key in self.shard.pop_due(self.now):
                self.apply(mem.fire(self.shard, key, self.now))
        self.now = end

    def records(self) -> list:
        return [r for b in self.batches for _, rs in iter_batches(b) for r in rs]

    def rebuilt(self) -> GroupShard:
        fresh = GroupShard(0, self.shard.config)
        for r in self.records():
            fresh.replay(r, self.now)
        return fresh

    @property
    def group(self):
        return self.shard.group(GROUP)

    # ---------------------------------------------------------------------------- requests
    def join(self, member_id: str = "", *, instance: str | None = None, version: int = 5,
             protocols=(("range", None),), topics=("t",), session_ms: int = 10_000,
             rebalance_ms: int = 30_000, client: str = "client", protocol_type: str = "consumer",
             group: str = GROUP):
        req = JoinGroupRequest(group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                               member_id=member_id, group_instance_id=instance, protocol_type=protocol_type,
                               protocols=[JoinGroupRequestProtocol(name=n, metadata=m if m is not None
                                                                   else subscription(*topics))
                                          for n, m in protocols])
        return self.run(mem.join_group, req, Caller(client, "/127.0.0.1", version))

    def join_new(self, **kw):
        """A dynamic member's first join at v4+: MEMBER_ID_REQUIRED, then the join with that id."""
        first = self.join(**kw)
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED and first.member_id
        return first.member_id, self.join(first.member_id, **kw)

    def sync(self, member_id: str, generation: int, assignments: dict | None = None, *,
             instance: str | None = None, version: int = 3, protocol_type=None, protocol_name=None):
        req = SyncGroupRequest(group_id=GROUP, generation_id=generation, member_id=member_id,
                               group_instance_id=instance, protocol_type=protocol_type,
                               protocol_name=protocol_name,
                               assignments=[SyncGroupRequestAssignment(member_id=m, assignment=a)
                                            for m, a in (assignments or {}).items()])
        return self.run(mem.sync_group, req, Caller("client", "/127.0.0.1", version))

    def heartbeat(self, member_id: str, generation: int, *, instance: str | None = None):
        req = HeartbeatRequest(group_id=GROUP, generation_id=generation, member_id=member_id,
                               group_instance_id=instance)
        return self.run(mem.heartbeat, req, Caller("client", "/127.0.0.1", 3)).error_code

    def leave(self, *members, version: int = 3):
        """members: member ids, or (member id, instance id) pairs."""
        if version < 3:
            req = LeaveGroupRequest(group_id=GROUP, member_id=members[0])
        else:
            req = LeaveGroupRequest(group_id=GROUP, members=[
                MemberIdentity(member_id=m[0], group_instance_id=m[1]) if isinstance(m, tuple)
                else MemberIdentity(member_id=m) for m in members])
        return self.run(mem.leave_group, req, Caller("client", "/127.0.0.1", version))

    def commit(self, offsets: dict, *, member_id: str = "", generation: int = -1, instance: str | None = None,
               metadata: str = "", version: int = 8, retention_ms: int = -1, group: str = GROUP,
               unknown_topics=()):
        by_topic: dict[str, list] = {}
        for (topic, partition), offset in offsets.items():
            by_topic.setdefault(topic, []).append(OffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_metadata=metadata))
        req = OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
                                  group_instance_id=instance, retention_time_ms=retention_ms,
                                  topics=[OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()])
        topic_error = (lambda name: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if name in unknown_topics else ErrorCode.NONE)
        response = self.run(offs.commit_offsets, req, version, topic_error)
        return {(t.name, p.partition_index): ErrorCode(p.error_code) for t in response.topics for p in t.partitions}

    def fetch(self, topics=None, group: str = GROUP) -> dict:
        found = offs.fetch_offsets(self.shard, group, topics)
        return {(t, p): (o.offset if o is not None else -1) for t, parts in found for p, o in parts}

    # ---------------------------------------------------------------------------- scenarios
    def stable_group(self, n: int = 1, **kw) -> list[str]:
        """n dynamic members joined (one generation) and synced: the member ids, leader first."""
        ids, pending = [], []
        for _ in range(n):
            member_id, response = self.join_new(**kw)
            ids.append(member_id)
            pending.append(response)
        self.advance(0)
        responses = [self.result(p) for p in pending]
        if any(r is None for r in responses):   # joined during a rebalance: everyone rejoins
            self.advance(self.shard.config.initial_rebalance_delay_ms)
            responses = [self.result(p) or p for p in pending]
        for r in responses:
            assert not isinstance(r, Pending) and r.error_code == ErrorCode.NONE, r
        generation = responses[0].generation_id
        leader = responses[0].leader
        plan = {m: assignment(t=[i]) for i, m in enumerate(ids)}
        results = {leader: self.sync(leader, generation, plan)}
        for m in ids:
            if m != leader:
                results[m] = self.sync(m, generation)
        assert all(r.error_code == ErrorCode.NONE for r in results.values())
        return [leader] + [m for m in ids if m != leader]
