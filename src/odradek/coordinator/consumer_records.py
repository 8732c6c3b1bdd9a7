"""The `__consumer_offsets` records of the consumer group protocol (seed 002, "Records"), in Apache
Kafka 4.x's formats so tools that decode the topic read ours.

    key version  key                                       value                               means
    3            ConsumerGroupMetadataKey (group)          ConsumerGroupMetadataValue          group epoch
    4            ConsumerGroupPartitionMetadataKey         ConsumerGroupPartitionMetadataValue subscribed topics' metadata
    5            ConsumerGroupMemberMetadataKey (member)   ConsumerGroupMemberMetadataValue    a member's subscription
    6            ConsumerGroupTargetAssignmentMetadataKey  ...TargetAssignmentMetadataValue    target assignment epoch
    7            ConsumerGroupTargetAssignmentMemberKey    ...TargetAssignmentMemberValue      a member's target partitions
    8            ConsumerGroupCurrentMemberAssignmentKey   ...CurrentMemberAssignmentValue     a member's epoch, state, partitions
    16           ConsumerGroupRegularExpressionKey         ...RegularExpressionValue           topics a subscribed regex resolved to

A resolved regular expression (Kafka 4.0's record type 16) holds the topics, the version of the topic
list it was resolved against (`TopicsView.version`) and the time; `consumer_heartbeat` writes one when
a member's regex is first resolved or resolves differently, and tombstones it when no member uses it.

The partition metadata record carries each partition's replica racks (Kafka 3.7+'s PartitionMetadata)
while some member has a rack id, so a change of racks is a change of the subscribed topics' metadata.

A null value is a tombstone. Values are written at version 0.

odradek extensions (docs/extensions.md), in tagged fields Kafka's tools skip: a member's client-side
assignors (MemberMetadataValue tag 16384) and the metadata a client-side assignor gave a member with
its target (TargetAssignmentMemberValue tags 16384-16385), and the name of the client-side assignor
that computed the target (TargetAssignmentMetadataValue tag 16384).

Partitions are held as `{topic_id: frozenset(partitions)}` with no empty sets, so two assignments
are equal exactly when they name the same partitions.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from odradek.protocol.api import decode_record, encode_record
from odradek.protocol.messages import consumer_group_current_member_assignment_value as cur
from odradek.protocol.messages import consumer_group_member_metadata_value as mmv
from odradek.protocol.messages import consumer_group_partition_metadata_value as pmv
from odradek.protocol.messages import consumer_group_regular_expression_value as rxv
from odradek.protocol.messages.consumer_group_regular_expression_key import ConsumerGroupRegularExpressionKey
from odradek.protocol.messages import consumer_group_target_assignment_member_value as tmv
from odradek.protocol.messages.consumer_group_current_member_assignment_key import (
    ConsumerGroupCurrentMemberAssignmentKey,
)
from odradek.protocol.messages.consumer_group_member_metadata_key import ConsumerGroupMemberMetadataKey
from odradek.protocol.messages.consumer_group_metadata_key import ConsumerGroupMetadataKey
from odradek.protocol.messages.consumer_group_metadata_value import ConsumerGroupMetadataValue
from odradek.protocol.messages.consumer_group_partition_metadata_key import ConsumerGroupPartitionMetadataKey
from odradek.protocol.messages.consumer_group_target_assignment_member_key import (
    ConsumerGroupTargetAssignmentMemberKey,
)
from odradek.protocol.messages.consumer_group_target_assignment_metadata_key import (
    ConsumerGroupTargetAssignmentMetadataKey,
)
from odradek.protocol.messages.consumer_group_target_assignment_metadata_value import (
    ConsumerGroupTargetAssignmentMetadataValue,
)

Partitions = Mapping[uuid.UUID, frozenset[int]]

GROUP_EPOCH_KEY, PARTITION_METADATA_KEY, MEMBER_KEY = 3, 4, 5
TARGET_EPOCH_KEY, TARGET_MEMBER_KEY, CURRENT_ASSIGNMENT_KEY = 6, 7, 8
REGEX_KEY = 16
KEY_VERSIONS = frozenset({3, 4, 5, 6, 7, 8, 16})
VALUE_VERSION = 0


def partitions_of(pairs: Iterable[tuple[uuid.UUID, Iterable[int]]]) -> dict[uuid.UUID, frozenset[int]]:
    out: dict[uuid.UUID, frozenset[int]] = {}
    for topic_id, parts in pairs:
        merged = out.get(topic_id, frozenset()) | frozenset(parts)
        if merged:
            out[topic_id] = merged
    return out


@dataclass(frozen=True, slots=True)
class TopicMeta:
    """A subscribed topic's metadata as the group saw it; `racks`: each partition's replica racks
    (sorted), kept only while some member has a rack id (empty otherwise), so a rack change bumps the
    group epoch of exactly the groups whose assignment depends on racks."""
    topic_id: uuid.UUID
    num_partitions: int
    racks: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class ClassicMeta:
    """What a member that speaks the classic protocol (JoinGroup, SyncGroup, Heartbeat) in a consumer
    group keeps: its session timeout and its protocols (name, metadata) in its order of preference."""
    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class ClientAssignor:
    """A client-side assignor a member supports (seed 002, "Assignor"): its name, the metadata versions
    it reads, and the member's metadata for it (version, reason, bytes)."""
    name: str
    minimum_version: int
    maximum_version: int
    reason: int
    version: int
    metadata: bytes


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None
    classic: ClassicMeta | None = None   # a classic member's protocol data (online migration)
    client_assignors: tuple[ClientAssignor, ...] = ()   # in the member's order of preference


@dataclass(frozen=True, slots=True)
class CurrentAssignment:
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned: Partitions
    pending_revocation: Partitions


@dataclass(frozen=True, slots=True)
class GroupEpochRecord:
    group_id: str
    epoch: int | None


@dataclass(frozen=True, slots=True)
class SubscriptionMetadataRecord:
    group_id: str
    topics: Mapping[str, TopicMeta] | None


@dataclass(frozen=True, slots=True)
class MemberRecord:
    group_id: str
    member_id: str
    value: MemberSubscription | None


@dataclass(frozen=True, slots=True)
class TargetEpochRecord:
    group_id: str
    assignment_epoch: int | None
    assignor: str | None = None   # the client-side assignor that computed the target; None: server-side


@dataclass(frozen=True, slots=True)
class TargetMemberRecord:
    group_id: str
    member_id: str
    partitions: Partitions | None
    metadata: tuple[int, bytes] | None = None   # (version, bytes) from a client-side assignor


@dataclass(frozen=True, slots=True)
class CurrentAssignmentRecord:
    group_id: str
    member_id: str
    value: CurrentAssignment | None


@dataclass(frozen=True, slots=True)
class ResolvedRegex:
    topics: tuple[str, ...]        # sorted
    version: int                   # TopicsView.version it was resolved against
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class RegexRecord:
    group_id: str
    regex: str
    value: ResolvedRegex | None


ConsumerRecord = Union[GroupEpochRecord, SubscriptionMetadataRecord, MemberRecord, TargetEpochRecord,
                       TargetMemberRecord, CurrentAssignmentRecord, RegexRecord]
CONSUMER_RECORD_TYPES = (GroupEpochRecord, SubscriptionMetadataRecord, MemberRecord, TargetEpochRecord,
                         TargetMemberRecord, CurrentAssignmentRecord, RegexRecord)


def remove_member_records(group_id: str, member_id: str) -> list[ConsumerRecord]:
    """Tombstones for a member, in the order Kafka writes them."""
    return [CurrentAssignmentRecord(group_id, member_id, None), TargetMemberRecord(group_id, member_id, None),
            MemberRecord(group_id, member_id, None)]


def _tps(cls: type, parts: Partitions) -> list:
    return [cls(topic_id=t, partitions=sorted(ps)) for t, ps in sorted(parts.items(), key=lambda kv: str(kv[0]))]


def _value(name: str, value: object | None) -> bytes | None:
    return None if value is None else encode_record(name, VALUE_VERSION, value)


def encode(record: ConsumerRecord) -> tuple[bytes, bytes | None]:
    r = record
    if isinstance(r, GroupEpochRecord):
        key = encode_record("ConsumerGroupMetadataKey", GROUP_EPOCH_KEY, ConsumerGroupMetadataKey(group_id=r.group_id))
        return key, _value("ConsumerGroupMetadataValue",
                           None if r.epoch is None else ConsumerGroupMetadataValue(epoch=r.epoch))
    if isinstance(r, SubscriptionMetadataRecord):
        key = encode_record("ConsumerGroupPartitionMetadataKey", PARTITION_METADATA_KEY,
                            ConsumerGroupPartitionMetadataKey(group_id=r.group_id))
        value: object | None = None if r.topics is None else pmv.ConsumerGroupPartitionMetadataValue(topics=[
            pmv.TopicMetadata(topic_id=m.topic_id, topic_name=name, num_partitions=m.num_partitions,
                              partition_metadata=[pmv.PartitionMetadata(partition=p, racks=list(racks))
                                                  for p, racks in enumerate(m.racks)])
            for name, m in sorted(r.topics.items())])
        return key, _value("ConsumerGroupPartitionMetadataValue", value)
    if isinstance(r, MemberRecord):
        key = encode_record("ConsumerGroupMemberMetadataKey", MEMBER_KEY,
                            ConsumerGroupMemberMetadataKey(group_id=r.group_id, member_id=r.member_id))
        s = r.value
        member_value: object | None = None if s is None else mmv.ConsumerGroupMemberMetadataValue(
            instance_id=s.instance_id, rack_id=s.rack_id, client_id=s.client_id, client_host=s.client_host,
            subscribed_topic_names=list(s.subscribed_topic_names), subscribed_topic_regex=s.subscribed_topic_regex,
            rebalance_timeout_ms=s.rebalance_timeout_ms, server_assignor=s.server_assignor,
            classic_member_metadata=None if s.classic is None else mmv.ClassicMemberMetadata(
                session_timeout_ms=s.classic.session_timeout_ms,
                supported_protocols=[mmv.ClassicProtocol(name=n, metadata=m) for n, m in s.classic.protocols]),
            client_assignors=[mmv.ClientAssignor(name=a.name, minimum_version=a.minimum_version,
                                                 maximum_version=a.maximum_version, reason=a.reason,
                                                 version=a.version, metadata=a.metadata)
                              for a in s.client_assignors] or None)
        return key, _value("ConsumerGroupMemberMetadataValue", member_value)
    if isinstance(r, TargetEpochRecord):
        key = encode_record("ConsumerGroupTargetAssignmentMetadataKey", TARGET_EPOCH_KEY,
                            ConsumerGroupTargetAssignmentMetadataKey(group_id=r.group_id))
        return key, _value("ConsumerGroupTargetAssignmentMetadataValue", None if r.assignment_epoch is None
                           else ConsumerGroupTargetAssignmentMetadataValue(assignment_epoch=r.assignment_epoch,
                                                                           assignor_name=r.assignor))
    if isinstance(r, TargetMemberRecord):
        key = encode_record("ConsumerGroupTargetAssignmentMemberKey", TARGET_MEMBER_KEY,
                            ConsumerGroupTargetAssignmentMemberKey(group_id=r.group_id, member_id=r.member_id))
        target_value: object | None = None
        if r.partitions is not None:
            version, data = r.metadata if r.metadata is not None else (-1, None)
            target_value = tmv.ConsumerGroupTargetAssignmentMemberValue(
                topic_partitions=_tps(tmv.TopicPartition, r.partitions), metadata_version=version, metadata_bytes=data)
        return key, _value("ConsumerGroupTargetAssignmentMemberValue", target_value)
    if isinstance(r, RegexRecord):
        key = encode_record("ConsumerGroupRegularExpressionKey", REGEX_KEY,
                            ConsumerGroupRegularExpressionKey(group_id=r.group_id, regular_expression=r.regex))
        rx = r.value
        return key, _value("ConsumerGroupRegularExpressionValue", None if rx is None else
                           rxv.ConsumerGroupRegularExpressionValue(topics=list(rx.topics), version=rx.version,
                                                                   timestamp=rx.timestamp_ms))
    assert isinstance(r, CurrentAssignmentRecord)
    key = encode_record("ConsumerGroupCurrentMemberAssignmentKey", CURRENT_ASSIGNMENT_KEY,
                        ConsumerGroupCurrentMemberAssignmentKey(group_id=r.group_id, member_id=r.member_id))
    c = r.value
    current_value: object | None = None if c is None else cur.ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=c.member_epoch, previous_member_epoch=c.previous_member_epoch, state=c.state,
        assigned_partitions=_tps(cur.TopicPartitions, c.assigned),
        partitions_pending_revocation=_tps(cur.TopicPartitions, c.pending_revocation))
    return key, _value("ConsumerGroupCurrentMemberAssignmentValue", current_value)


def _dec(name: str, data: bytes) -> Any:
    return decode_record(name, data)[1]


def _classic(c: Any) -> ClassicMeta | None:
    if c is None:
        return None
    return ClassicMeta(c.session_timeout_ms, tuple((p.name, bytes(p.metadata)) for p in c.supported_protocols))


def _racks(t: Any) -> tuple[tuple[str, ...], ...]:
    """Each partition's racks when the record has them for exactly partitions 0..n-1 (Kafka 3.7+
    writes every partition), else none: the next heartbeat then writes them again."""
    entries = t.partition_metadata or ()
    if not entries or len(entries) != t.num_partitions:
        return ()
    by_partition = {e.partition: tuple(sorted(e.racks)) for e in entries}
    if len(by_partition) != len(entries) or any(p not in by_partition for p in range(len(entries))):
        return ()
    return tuple(by_partition[p] for p in range(len(entries)))


def decode(key_version: int, key: bytes, value: bytes | None) -> ConsumerRecord:
    """A record of one of KEY_VERSIONS; raises ProtocolError when it does not parse."""
    if key_version == GROUP_EPOCH_KEY:
        k = _dec("ConsumerGroupMetadataKey", key)
        if value is None:
            return GroupEpochRecord(k.group_id, None)
        v = _dec("ConsumerGroupMetadataValue", value)
        return GroupEpochRecord(k.group_id, v.epoch)
    if key_version == PARTITION_METADATA_KEY:
        k = _dec("ConsumerGroupPartitionMetadataKey", key)
        if value is None:
            return SubscriptionMetadataRecord(k.group_id, None)
        v = _dec("ConsumerGroupPartitionMetadataValue", value)
        return SubscriptionMetadataRecord(k.group_id, {t.topic_name: TopicMeta(t.topic_id, t.num_partitions,
                                                                               _racks(t))
                                                       for t in v.topics})
    if key_version == MEMBER_KEY:
        k = _dec("ConsumerGroupMemberMetadataKey", key)
        if value is None:
            return MemberRecord(k.group_id, k.member_id, None)
        v = _dec("ConsumerGroupMemberMetadataValue", value)
        return MemberRecord(k.group_id, k.member_id, MemberSubscription(
            v.instance_id, v.rack_id, v.client_id, v.client_host, tuple(v.subscribed_topic_names),
            v.subscribed_topic_regex or None, v.rebalance_timeout_ms, v.server_assignor or None,
            _classic(v.classic_member_metadata),
            tuple(ClientAssignor(a.name, a.minimum_version, a.maximum_version, a.reason, a.version, bytes(a.metadata))
                  for a in v.client_assignors or ())))
    if key_version == TARGET_EPOCH_KEY:
        k = _dec("ConsumerGroupTargetAssignmentMetadataKey", key)
        if value is None:
            return TargetEpochRecord(k.group_id, None)
        v = _dec("ConsumerGroupTargetAssignmentMetadataValue", value)
        return TargetEpochRecord(k.group_id, v.assignment_epoch, v.assignor_name or None)
    if key_version == TARGET_MEMBER_KEY:
        k = _dec("ConsumerGroupTargetAssignmentMemberKey", key)
        if value is None:
            return TargetMemberRecord(k.group_id, k.member_id, None)
        v = _dec("ConsumerGroupTargetAssignmentMemberValue", value)
        metadata = None if v.metadata_bytes is None else (v.metadata_version, bytes(v.metadata_bytes))
        return TargetMemberRecord(k.group_id, k.member_id,
                                  partitions_of((t.topic_id, t.partitions) for t in v.topic_partitions), metadata)
    if key_version == REGEX_KEY:
        k = _dec("ConsumerGroupRegularExpressionKey", key)
        if value is None:
            return RegexRecord(k.group_id, k.regular_expression, None)
        v = _dec("ConsumerGroupRegularExpressionValue", value)
        return RegexRecord(k.group_id, k.regular_expression, ResolvedRegex(tuple(sorted(v.topics)), v.version,
                                                                           v.timestamp))
    assert key_version == CURRENT_ASSIGNMENT_KEY, key_version
    k = _dec("ConsumerGroupCurrentMemberAssignmentKey", key)
    if value is None:
        return CurrentAssignmentRecord(k.group_id, k.member_id, None)
    v = _dec("ConsumerGroupCurrentMemberAssignmentValue", value)
    return CurrentAssignmentRecord(k.group_id, k.member_id, CurrentAssignment(
        v.member_epoch, v.previous_member_epoch, v.state,
        partitions_of((t.topic_id, t.partitions) for t in v.assigned_partitions),
        partitions_of((t.topic_id, t.partitions) for t in v.partitions_pending_revocation)))
