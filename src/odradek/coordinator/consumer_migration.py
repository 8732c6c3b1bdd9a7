"""Online conversion between a classic group and a consumer group (seed 002, KIP-848, "Upgrade &
Downgrade" of a live group; Kafka's `group.consumer.migration.policy`: disabled, upgrade, downgrade or
bidirectional, the default since Kafka 3.8).

- Upgrade: the first ConsumerGroupHeartbeat (epoch 0) to a non-empty classic group of the "consumer"
  protocol type converts it. Every classic member becomes a member of the consumer group at the
  group's generation, Stable, owning what its last SyncGroup gave it; the target assignment is that
  assignment, so nothing moves until the joining member bumps the group epoch. JoinGroups and
  SyncGroups still parked get REBALANCE_IN_PROGRESS and come back through `consumer_classic`.
- Downgrade: when the last member that speaks the consumer protocol leaves (epoch -1, its session or
  its rebalance timeout) and only classic members remain, the group becomes a classic group of
  generation = the group epoch, Stable with each member's target assignment, and a rebalance starts
  at once, so every member rejoins before anybody gets a partition (the eager protocol's safety).

Records: the old group's tombstones, then the new group's records, as Kafka writes them. The
operation replays them itself (`Outcome.replayed`) because it goes on with the converted group.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from odradek.coordinator import rebalance as rb
from odradek.coordinator.consumer_group import (
    ConsumerGroup, ConsumerMember, MemberState, TopicsView, subscription_metadata,
)
from odradek.coordinator.consumer_records import (
    ClassicMeta, ConsumerRecord, CurrentAssignment, CurrentAssignmentRecord, GroupEpochRecord, MemberRecord,
    MemberSubscription, Partitions, RegexRecord, SubscriptionMetadataRecord, TargetEpochRecord, TargetMemberRecord,
    partitions_of, remove_member_records,
)
from odradek.coordinator.group import CONSUMER_PROTOCOL_TYPE, ClassicGroup, GroupState, Member
from odradek.coordinator.records import GroupRecord, Record
from odradek.coordinator.shard import GroupShard, Outcome, join_key, sync_key
from odradek.protocol.api import decode_record, encode_record
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages import consumer_protocol_assignment as cpa
from odradek.protocol.messages import consumer_protocol_subscription as cps
from odradek.protocol.messages.sync_group import SyncGroupResponse

log = logging.getLogger("odradek.coordinator")

DISABLED, UPGRADE, DOWNGRADE, BIDIRECTIONAL = "disabled", "upgrade", "downgrade", "bidirectional"
SUBSCRIPTION_MAX_VERSION = 3
ASSIGNMENT_MAX_VERSION = 3


def upgrade_enabled(policy: str) -> bool:
    return policy.lower() in (UPGRADE, BIDIRECTIONAL)


def downgrade_enabled(policy: str) -> bool:
    return policy.lower() in (DOWNGRADE, BIDIRECTIONAL)


# ------------------------------------------------------------------------------------------ consumer protocol
def read_subscription(data: bytes) -> tuple[int, cps.ConsumerProtocolSubscription]:
    """(declared version, subscription). A version above the newest we know is read as the newest (each
    version only appends fields); one whose body does not match its declared version is read by the
    version 0 prefix, as Kafka's coordinator does. Raises ProtocolError when neither parses."""
    data = bytes(data)
    if len(data) < 2:
        raise ProtocolError("ConsumerProtocolSubscription truncated")
    declared = int.from_bytes(data[:2], "big", signed=True)
    if declared < 0:
        raise ProtocolError("ConsumerProtocolSubscription with a negative version")
    version = min(declared, SUBSCRIPTION_MAX_VERSION)
    try:
        _, sub = decode_record("ConsumerProtocolSubscription", version.to_bytes(2, "big") + data[2:])
    except ProtocolError:
        _, sub = decode_record("ConsumerProtocolSubscription", b"\x00\x00" + data[2:])
        version = 0
    assert isinstance(sub, cps.ConsumerProtocolSubscription)
    return version, sub


def read_assignment(data: bytes) -> list[tuple[str, list[int]]]:
    """The partitions of a ConsumerProtocolAssignment; none for empty or unreadable bytes."""
    data = bytes(data)
    if len(data) < 2 or int.from_bytes(data[:2], "big", signed=True) < 0:
        return []
    version = min(int.from_bytes(data[:2], "big"), ASSIGNMENT_MAX_VERSION)
    try:
        _, a = decode_record("ConsumerProtocolAssignment", version.to_bytes(2, "big") + data[2:])
    except ProtocolError:
        return []
    assert isinstance(a, cpa.ConsumerProtocolAssignment)
    return [(tp.topic, list(tp.partitions)) for tp in a.assigned_partitions]


def encode_assignment(parts: Partitions, topics: TopicsView, version: int) -> bytes:
    """A member's partitions as the consumer protocol's assignment bytes (topic names, sorted)."""
    named = sorted((topics.name_of(t), sorted(ps)) for t, ps in parts.items() if topics.name_of(t) is not None)
    return encode_record("ConsumerProtocolAssignment", max(0, min(version, ASSIGNMENT_MAX_VERSION)),
                         cpa.ConsumerProtocolAssignment(assigned_partitions=[
                             cpa.TopicPartition(topic=n, partitions=ps) for n, ps in named]))


def by_topic_id(named: Iterable[tuple[str, Iterable[int]]], topics: TopicsView) -> dict[uuid.UUID, frozenset[int]]:
    """Partitions by topic name as partitions by topic id; topics that do not exist are left out."""
    return partitions_of((topics.by_name[n].topic_id, ps) for n, ps in named if n in topics.by_name)


def subscription_version(member: Member | ClassicMeta, protocol: str | None) -> int:
    protocols = member.protocols
    data = next((m for n, m in protocols if n == protocol), protocols[0][1] if protocols else b"")
    return int.from_bytes(bytes(data[:2]), "big", signed=True) if len(data) >= 2 else 0


# ------------------------------------------------------------------------------------------ upgrade
def refuse_upgrade(shard: GroupShard, classic: ClassicGroup) -> str | None:
    """Why the non-empty classic group cannot become a consumer group now, or None."""
    if not upgrade_enabled(shard.config.consumer_migration_policy):
        return f"group.consumer.migration.policy is {shard.config.consumer_migration_policy}"
    if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return f"its protocol type is {classic.protocol_type!r}, not the consumer protocol"
    if len(classic.members) >= shard.config.consumer_max_size:
        return f"it has {len(classic.members)} members and group.consumer.max.size is {shard.config.consumer_max_size}"
    for m in classic.members.values():
        try:
            read_subscription(m.metadata(classic.protocol_name) if classic.protocol_name else m.protocols[0][1])
        except (ProtocolError, ValueError, IndexError):
            return f"member {m.member_id}'s subscription does not parse"
    return None


def upgrade(shard: GroupShard, classic: ClassicGroup, topics: TopicsView, now_ms: int, out: Outcome) -> ConsumerGroup:
    """Convert the classic group; its records go first in `out` and are replayed at once."""
    gid, generation = classic.group_id, classic.generation
    log.info("group %s: converting the classic group (generation %d, %d members, state %s) to a consumer group",
             gid, generation, len(classic.members), classic.state.value)
    for m in classic.members.values():
        if m.awaiting_join:
            out.completions.append((join_key(gid, m.member_id), rb.join_error(ErrorCode.REBALANCE_IN_PROGRESS)))
        if m.awaiting_sync:
            out.completions.append((sync_key(gid, m.member_id),
                                    SyncGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)))
    records: list[Record] = [GroupRecord(gid, None)]
    members: list[ConsumerMember] = []
    currents: list[ConsumerRecord] = []
    targets: list[ConsumerRecord] = []
    for m in classic.members.values():
        _, sub = read_subscription(m.metadata(classic.protocol_name) if classic.protocol_name else m.protocols[0][1])
        subscription = MemberSubscription(
            instance_id=m.group_instance_id, rack_id=getattr(sub, "rack_id", None) or None, client_id=m.client_id,
            client_host=m.client_host, subscribed_topic_names=tuple(sub.topics), subscribed_topic_regex=None,
            rebalance_timeout_ms=m.rebalance_timeout_ms, server_assignor=None,
            classic=ClassicMeta(m.session_timeout_ms, tuple((n, bytes(d)) for n, d in m.protocols)))
        assigned = by_topic_id(read_assignment(m.assignment), topics)
        records.append(MemberRecord(gid, m.member_id, subscription))
        targets.append(TargetMemberRecord(gid, m.member_id, assigned))
        currents.append(CurrentAssignmentRecord(gid, m.member_id, CurrentAssignment(
            generation, generation, MemberState.STABLE, assigned, {})))
        members.append(ConsumerMember(m.member_id, subscription))
    records.append(GroupEpochRecord(gid, generation))
    records.append(SubscriptionMetadataRecord(gid, subscription_metadata(members, topics)))
    records += targets
    records.append(TargetEpochRecord(gid, generation))
    records += currents
    _apply(shard, records, now_ms, out)
    return shard.consumer_groups[gid]


def _apply(shard: GroupShard, records: list[Record], now_ms: int, out: Outcome) -> None:
    assert out.replayed == len(out.records), "a conversion's records come before everything else"
    for r in records:
        shard.replay(r, now_ms)
    out.records += records
    out.replayed = len(out.records)


# ------------------------------------------------------------------------------------------ downgrade
def group_tombstones(group: ConsumerGroup) -> list[Record]:
    """Every record of the group, tombstoned (members first, the group epoch last)."""
    out: list[Record] = []
    for member_id in sorted(group.members):
        out += remove_member_records(group.group_id, member_id)
    gid = group.group_id
    out += [RegexRecord(gid, regex, None) for regex in sorted(group.regexes)]
    out += [TargetEpochRecord(gid, None), SubscriptionMetadataRecord(gid, None), GroupEpochRecord(gid, None)]
    return out


def maybe_downgrade(shard: GroupShard, group: ConsumerGroup, leaving_id: str, fenced: Outcome,
                    now_ms: int) -> Outcome:
    """`fenced` (the leaving member's removal), or the group's conversion to a classic group when only
    classic members remain and the policy allows it."""
    rest = [m for m in group.members.values() if m.member_id != leaving_id]
    if not rest or not all(m.uses_classic_protocol for m in rest) \
            or not downgrade_enabled(shard.config.consumer_migration_policy) \
            or len(rest) > shard.config.max_size:
        return fenced
    gid = group.group_id
    log.info("group %s: the last member using the consumer protocol (%s) left; converting the group to a "
             "classic group with %d members", gid, leaving_id, len(rest))
    classic = ClassicGroup(gid, generation=group.group_epoch, protocol_type=CONSUMER_PROTOCOL_TYPE)
    for m in rest:
        meta = m.subscription.classic
        assert meta is not None
        s = m.subscription
        classic.add(Member(m.member_id, s.instance_id, s.client_id, s.client_host,
                           s.rebalance_timeout_ms if s.rebalance_timeout_ms > 0 else meta.session_timeout_ms,
                           meta.session_timeout_ms, CONSUMER_PROTOCOL_TYPE, list(meta.protocols)))
    classic.protocol_name = classic.select_protocol()
    view = TopicsView(dict(group.subscription_metadata))   # every topic of a target is in it
    assignments = {m.member_id: encode_assignment(group.target.get(m.member_id, {}), view,
                                                  subscription_version(classic.members[m.member_id],
                                                                       classic.protocol_name))
                   for m in rest}
    out = Outcome(fenced.response)
    _apply(shard, group_tombstones(group) + [GroupRecord(gid, classic.record_value(assignments, now_ms))],
           now_ms, out)
    converted = shard.group(gid)
    assert converted is not None and converted.state == GroupState.STABLE
    return out.add(rb.prepare_rebalance(shard, converted, now_ms, f"downgrade of group {gid} from consumer "
                                                                  "to classic"))
