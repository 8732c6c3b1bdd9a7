"""A classic group: its members, generation, selected protocol, leader and committed offsets
(seed 000, the group membership API; seed 004, "Group Membership API"; seed 001, "what the
coordinator stores"; seed 003, "Consumer Position": one offset per partition per group).

States, as Kafka names them:

    Empty                no members; may hold offsets (also the state of offset-only "simple" groups)
    PreparingRebalance   waiting for members to (re)join, at most the rebalance timeout
    CompletingRebalance  joined; waiting for the leader's SyncGroup with the assignment
    Stable               the assignment is persisted and handed out; members heartbeat
    Dead                 removed (deleted, or all offsets expired)

Two kinds of fields. The *durable* ones (generation, protocol type and name, leader, members with
their subscription and assignment, offsets) are what `GroupMetadataValue` and `OffsetCommitValue`
records carry; they are set by replaying records (see `shard.GroupShard.replay`). The *rebalance
bookkeeping* (who is awaiting join or sync, pending member ids, the initial-delay state) lives only
in memory, as in Kafka: a coordinator that takes over starts from the last generation written, and
its members rejoin (seed 001, coordinator failover).
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from dataclasses import dataclass, field

from odradek.coordinator.records import GroupMetadataValue, MemberMetadata, OffsetAndMetadata
from odradek.protocol.api import decode_record
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages.consumer_protocol_subscription import ConsumerProtocolSubscription

log = logging.getLogger("odradek.coordinator")

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(str, enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]       # (name, metadata), in the member's order of preference
    assignment: bytes = b""
    awaiting_join: bool = False
    awaiting_sync: bool = False
    is_new: bool = False

    def metadata(self, protocol: str | None) -> bytes:
        for name, data in self.protocols:
            if name == protocol:
                return data
        raise ValueError(f"member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return [(n, bytes(m)) for n, m in protocols] == [(n, bytes(m)) for n, m in self.protocols]

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")


@dataclass
class ClassicGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    previous_state: GroupState = GroupState.EMPTY
    state_timestamp_ms: int | None = None
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)        # insertion (join) order
    static_members: dict[str, str] = field(default_factory=dict)    # group.instance.id -> member id
    pending_members: set[str] = field(default_factory=set)          # handed an id (MEMBER_ID_REQUIRED)
    pending_sync: set[str] = field(default_factory=set)
    new_member_added: bool = False
    initial_delay: tuple[int, int] | None = None                    # (delay, remaining) while delaying
    offsets: dict[tuple[str, int], OffsetAndMetadata] = field(default_factory=dict)
    _protocol_votes: Counter = field(default_factory=Counter)

    # ------------------------------------------------------------------------------ state
    def transition(self, state: GroupState, now_ms: int) -> None:
        self.previous_state = self.state
        self.state = state
        self.state_timestamp_ms = now_ms

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    @property
    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # ------------------------------------------------------------------------------ members
    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        assert self.protocol_type == member.protocol_type, "a group's members share one protocol type"
        self.members[member.member_id] = member
        self._protocol_votes.update(name for name, _ in member.protocols)
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        self.pending_members.discard(member.member_id)
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        self.pending_members.discard(member_id)
        self.pending_sync.discard(member_id)
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        self._protocol_votes.subtract(name for name, _ in member.protocols)
        if member.group_instance_id is not None and \
                self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def update_protocols(self, member: Member, protocols: list[tuple[str, bytes]],
                         rebalance_timeout_ms: int, session_timeout_ms: int) -> None:
        self._protocol_votes.subtract(name for name, _ in member.protocols)
        member.protocols = protocols
        self._protocol_votes.update(name for name, _ in protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """The member known as `old_id` is now `new_id` (a static member restarted); it keeps its
        place, protocols and assignment."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode:
        """UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID (another process now holds the instance id)."""
        if instance_id is not None:
            known = self.static_members.get(instance_id)
            if known is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if known != member_id:
                log.info("group %s: member %s with group.instance.id %s is fenced by member %s",
                         self.group_id, member_id, instance_id, known)
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    def maybe_elect_new_joined_leader(self) -> bool:
        """If the leader has not rejoined, any member that has becomes leader; False if none has."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].awaiting_join:
            return True
        for m in self.members.values():
            if m.awaiting_join:
                log.info("group %s: leader %s did not rejoin in time; %s is the new leader",
                         self.group_id, self.leader_id, m.member_id)
                self.leader_id = m.member_id
                return True
        return False

    # ------------------------------------------------------------------------------ protocols
    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if self.state == GroupState.EMPTY:
            return bool(protocol_type) and bool(protocols)
        n = len(self.members)
        return self.protocol_type == protocol_type and \
            any(self._protocol_votes[name] == n for name, _ in protocols)

    def select_protocol(self) -> str:
        """The protocol every member supports with the most first-choice votes (Kafka's rule); ties
        go to the one the longest-standing member prefers, so the choice is deterministic."""
        assert self.members, "cannot select a protocol for an empty group"
        n = len(self.members)
        candidates = {name for name, count in self._protocol_votes.items() if count == n}
        assert candidates, f"group {self.group_id} has no protocol every member supports"
        votes = Counter(m.vote(candidates) for m in self.members.values())
        best = max(votes.values())
        first = next(iter(self.members.values()))
        return next(name for name, _ in first.protocols if votes.get(name) == best)

    def init_next_generation(self, now_ms: int) -> None:
        self.generation += 1
        self.pending_sync.clear()
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition(GroupState.EMPTY, now_ms)

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members subscribe to, from the consumer protocol's metadata; None when it
        cannot be known (another protocol type, or metadata that does not parse)."""
        if not self.members:
            return set()
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            try:
                topics.update(parse_subscription(m.metadata(self.protocol_name)))
            except (ProtocolError, ValueError):
                return None
        return topics

    # ------------------------------------------------------------------------------ records
    def record_value(self, assignments: dict[str, bytes], now_ms: int) -> GroupMetadataValue:
        """The GroupMetadataValue for the group as it is now with `assignments` (by member id)."""
        return GroupMetadataValue(
            protocol_type=self.protocol_type or "", generation=self.generation,
            protocol=self.protocol_name, leader=self.leader_id if self.members else None,
            current_state_timestamp=now_ms,
            members=[MemberMetadata(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, rebalance_timeout=m.rebalance_timeout_ms,
                session_timeout=m.session_timeout_ms, subscription=m.metadata(self.protocol_name),
                assignment=assignments.get(m.member_id, b"")) for m in self.members.values()])

    def durable_view(self) -> tuple:
        """What the records say about this group: equal for a live group and one rebuilt by replay
        whenever the group is Empty or Stable."""
        members = tuple((m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                         m.session_timeout_ms, bytes(m.metadata(self.protocol_name)), bytes(m.assignment))
                        for m in self.members.values())
        return (self.state.value, self.generation, self.protocol_type, self.protocol_name,
                self.leader_id, self.state_timestamp_ms, members, tuple(sorted(self.offsets.items())))


def parse_subscription(data: bytes) -> list[str]:
    """The topics of a ConsumerProtocolSubscription, read by its version 0 prefix whatever version it
    declares, as Kafka's coordinator reads them (every later version starts with the v0 fields, and
    some clients declare v1 but send the v0 layout). The declared version must not be negative."""
    data = bytes(data)
    if len(data) < 2 or int.from_bytes(data[:2], "big", signed=True) < 0:
        raise ProtocolError("ConsumerProtocolSubscription without a valid version")
    _, sub = decode_record("ConsumerProtocolSubscription", b"\x00\x00" + data[2:])
    assert isinstance(sub, ConsumerProtocolSubscription)
    return list(sub.topics)
