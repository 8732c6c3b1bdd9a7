"""The state of one `__consumer_offsets` partition's groups, and the shapes operations return
(STYLE, "Coordinators as replicated state machines"; DESIGN, "How data flows: Groups and
transactions").

An operation is a plain function `op(shard, request, ..., now_ms) -> Outcome`. It reads the shard,
may update rebalance bookkeeping (see `group`), and returns:

- `response`: the answer to its caller, or None when the caller waits (`park`, a JoinGroup or
  SyncGroup that completes when other members arrive or a timer fires);
- `records`: what to append to the partition; durable state changes only when the runtime replays
  them through `replay`, the same function that loads the partition after a restart or failover;
- `completions`: answers for parked callers, handed out after the records are appended;
- `replayed`: how many of the first records the operation has already replayed itself. Only a
  group's conversion between the classic and the consumer protocol does that (Kafka's coordinator
  also applies a conversion directly): the operation goes on with the converted group, so it replays
  the conversion's records first; if the append then fails the runtime reloads the partition.

Timers are data: `schedule(key, deadline_ms)` records a deadline in `timers`; the runtime sleeps
until `next_deadline()` and hands each due key to `membership.fire`. A moved deadline does not add
a heap entry (the old entry re-arms itself when it surfaces), so the heap holds at most about two
entries per key.
"""

from __future__ import annotations

import heapq
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from odradek.coordinator import consumer_group
from odradek.coordinator.consumer_group import ConsumerGroup
from odradek.coordinator.consumer_records import CONSUMER_RECORD_TYPES
from odradek.coordinator.group import ClassicGroup, GroupState, Member
from odradek.coordinator.records import (
    GroupMetadataValue, GroupRecord, OffsetAndMetadata, OffsetRecord, Record, TxnMarkerRecord, TxnOffsetRecord,
)

log = logging.getLogger("odradek.coordinator")

NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000     # Kafka's fixed timeout for a new member's first JoinGroup


@dataclass(frozen=True)
class GroupConfig:
    """Broker settings the group coordinator reads (Kafka's names, units last)."""
    min_session_timeout_ms: int = 6000                  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1800000               # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000              # group.initial.rebalance.delay.ms
    max_size: int = 2**31 - 1                           # group.max.size
    offset_metadata_max_bytes: int = 4096               # offset.metadata.max.bytes
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000    # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600000   # offsets.retention.check.interval.ms
    load_buffer_bytes: int = 5 * 1024 * 1024            # offsets.load.buffer.size
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS
    consumer_session_timeout_ms: int = 45000            # group.consumer.session.timeout.ms
    consumer_heartbeat_interval_ms: int = 5000          # group.consumer.heartbeat.interval.ms
    consumer_max_size: int = 2**31 - 1                  # group.consumer.max.size
    consumer_assignors: tuple[str, ...] = ("uniform", "range")   # group.consumer.assignors
    consumer_migration_policy: str = "bidirectional"    # group.consumer.migration.policy
    consumer_regex_refresh_interval_ms: int = 600000    # group.consumer.regex.refresh.interval.ms
    consumer_client_assignors_enable: bool = False      # group.consumer.client.assignors.enable (odradek)


WaitKey = tuple   # ("join" | "sync", group_id, member_id)
TimerKey = tuple  # ("session", group_id, member_id), ("offsets-retention",), ...


@dataclass
class Outcome:
    response: object = None
    park: WaitKey | None = None
    records: list[Record] = field(default_factory=list)
    completions: list[tuple[WaitKey, object]] = field(default_factory=list)
    replayed: int = 0

    def add(self, other: "Outcome") -> "Outcome":
        self.records += other.records
        self.completions += other.completions
        return self


def join_key(group_id: str, member_id: str) -> WaitKey:
    return ("join", group_id, member_id)


def sync_key(group_id: str, member_id: str) -> WaitKey:
    return ("sync", group_id, member_id)


class GroupShard:
    def __init__(self, partition: int, config: GroupConfig,
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        self.partition = partition
        self.config = config
        self.new_uuid = new_uuid
        self.groups: dict[str, ClassicGroup] = {}
        self.consumer_groups: dict[str, ConsumerGroup] = {}   # KIP-848 groups (see consumer_group)
        self.client_elections: dict[str, Any] = {}   # soft: group -> consumer_client_assign.Election
        # producer id -> (group, topic, partition) -> offset of its open transaction (TxnOffsetCommit)
        self.pending_txn_offsets: dict[int, dict[tuple[str, str, int], OffsetAndMetadata]] = {}
        self.timers: dict[TimerKey, int] = {}
        self._heap: list[tuple[int, int, TimerKey]] = []
        self._seq = 0

    # ------------------------------------------------------------------------------ timers
    def schedule(self, key: TimerKey, deadline_ms: int) -> None:
        old = self.timers.get(key)
        self.timers[key] = deadline_ms
        if old is None or deadline_ms < old:
            self._seq += 1
            heapq.heappush(self._heap, (deadline_ms, self._seq, key))

    def cancel(self, key: TimerKey) -> None:
        self.timers.pop(key, None)

    def next_deadline(self) -> int | None:
        heap = self._heap
        while heap:
            deadline, _, key = heap[0]
            current = self.timers.get(key)
            if current == deadline:
                return deadline
            heapq.heappop(heap)
            if current is not None and current > deadline:
                self._seq += 1
                heapq.heappush(heap, (current, self._seq, key))
        return None

    def pop_due(self, now_ms: int) -> list[TimerKey]:
        due: list[TimerKey] = []
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > now_ms:
                return due
            _, _, key = heapq.heappop(self._heap)
            del self.timers[key]
            due.append(key)

    # ------------------------------------------------------------------------------ groups
    def group(self, group_id: str) -> ClassicGroup | None:
        g = self.groups.get(group_id)
        return None if g is None or g.state == GroupState.DEAD else g

    def get_or_create(self, group_id: str) -> ClassicGroup:
        g = self.group(group_id)
        if g is None:
            g = self.groups[group_id] = ClassicGroup(group_id)
        return g

    def remove_group(self, group: ClassicGroup, now_ms: int) -> None:
        group.transition(GroupState.DEAD, now_ms)
        self.groups.pop(group.group_id, None)
        for key in [k for k in self.timers if len(k) > 1 and k[1] == group.group_id
                    and k[0] not in consumer_group.TIMER_KINDS]:
            self.cancel(key)

    # ------------------------------------------------------------------------------ replay
    def replay(self, record: Record, now_ms: int) -> None:
        """Apply one record. Later records win and tombstones delete, so a log with duplicates and
        tombstones (compacted or not) rebuilds the same state."""
        if isinstance(record, CONSUMER_RECORD_TYPES):
            consumer_group.replay(self, record, now_ms)
        elif isinstance(record, OffsetRecord):
            self._replay_offset(record, now_ms)
        elif isinstance(record, TxnOffsetRecord):
            r = record.record
            if r.value is not None:
                self.get_or_create(r.group_id)
                self.pending_txn_offsets.setdefault(record.producer_id, {})[(r.group_id, r.topic, r.partition)] = \
                    r.value
        elif isinstance(record, TxnMarkerRecord):
            pending = self.pending_txn_offsets.pop(record.producer_id, {})
            if record.commit:
                for (group_id, topic, partition), value in pending.items():
                    self._replay_offset(OffsetRecord(group_id, topic, partition, value), now_ms)
        else:
            self._replay_group(record, now_ms)

    def _replay_offset(self, r: OffsetRecord, now_ms: int) -> None:
        tp = (r.topic, r.partition)
        if r.value is not None:
            self.get_or_create(r.group_id).offsets[tp] = r.value
            return
        g = self.group(r.group_id)
        if g is not None:
            g.offsets.pop(tp, None)
            if not g.offsets and g.state == GroupState.EMPTY and g.protocol_type is None \
                    and g.generation == 0:
                self.remove_group(g, now_ms)   # an offsets-only group with nothing left

    def has_pending_txn_offsets(self, group_id: str, topic: str, partition: int) -> bool:
        """An open transaction has committed an offset of the partition for the group (KIP-447)."""
        key = (group_id, topic, partition)
        return any(key in pending for pending in self.pending_txn_offsets.values())

    def _replay_group(self, r: GroupRecord, now_ms: int) -> None:
        g = self.group(r.group_id)
        if r.value is None:
            if g is None:
                return
            if g.offsets:
                # Offsets outlive the group's metadata: what is left is a simple group (Kafka's loader).
                offsets = g.offsets
                self.remove_group(g, now_ms)
                self.get_or_create(r.group_id).offsets = offsets
            else:
                self.remove_group(g, now_ms)
            return
        if g is None:
            g = self.get_or_create(r.group_id)
        self._apply_group_value(g, r.value, now_ms)

    def _apply_group_value(self, g: ClassicGroup, v: GroupMetadataValue, now_ms: int) -> None:
        """Make the group's durable fields those of `v`: members keep their in-memory bookkeeping
        when they are already live (the record was just written for them), and are created (with a
        session timer from now) when loading."""
        g.generation = v.generation
        g.protocol_type = v.protocol_type or None
        g.protocol_name = v.protocol
        live = g.members
        g.members = {}
        g.static_members = {}
        g._protocol_votes.clear()
        for mm in v.members:
            m = live.get(mm.member_id)
            if m is None:
                rebalance_timeout = mm.session_timeout if mm.rebalance_timeout == -1 else mm.rebalance_timeout
                m = Member(mm.member_id, mm.group_instance_id, mm.client_id, mm.client_host,
                           rebalance_timeout, mm.session_timeout, v.protocol_type,
                           [(v.protocol, bytes(mm.subscription))])
                self.schedule(("heartbeat", g.group_id, m.member_id), now_ms + m.session_timeout_ms)
            m.assignment = bytes(mm.assignment)
            g.members[m.member_id] = m
            g._protocol_votes.update(name for name, _ in m.protocols)
            if m.group_instance_id is not None:
                g.static_members[m.group_instance_id] = m.member_id
        for member_id in live.keys() - g.members.keys():
            self.cancel(("heartbeat", g.group_id, member_id))
        g.leader_id = v.leader if g.members else None
        state = GroupState.STABLE if g.members else GroupState.EMPTY
        g.previous_state, g.state = g.state, state
        g.state_timestamp_ms = v.current_state_timestamp if v.current_state_timestamp >= 0 else None

    # ------------------------------------------------------------------------------ views
    def durable_view(self) -> dict:
        """Every group whose state the records determine (Empty or Stable, and written at least once:
        a group that only handed out a member id exists in memory alone), for replay equivalence."""
        return {gid: g.durable_view() for gid, g in sorted(self.groups.items())
                if g.state in (GroupState.EMPTY, GroupState.STABLE) and (g.generation > 0 or g.offsets)}
