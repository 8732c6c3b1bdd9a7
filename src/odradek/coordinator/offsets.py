"""Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete, offset retention and removal with deleted
topics (seed 003,
"Consumer Position": the position of a group in a partition is one integer, checkpointed; seed 004,
"Offset Commit/Fetch API": commits from outside group management use generation -1 and an empty
member id, and are refused while the group has members).

Commits are validated against the group's generation and membership (ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, REBALANCE_IN_PROGRESS while the leader's assignment is
pending); each accepted partition becomes one OffsetCommit record, and the offset is what replay
makes of it.

Retention (offsets.retention.minutes, KIP-211): an Empty group's offsets expire a retention period
after the group became empty; a Stable consumer group's offsets of topics no member subscribes to
expire a retention period after their commit; an offsets-only ("simple") group's offsets expire a
retention period after their commit; an offset committed with an explicit retention time (v2-v4)
expires at its own expire timestamp. An Empty group left without offsets is removed.
"""

from __future__ import annotations

import logging
from typing import Callable

from odradek.coordinator.group import CONSUMER_PROTOCOL_TYPE, ClassicGroup, GroupState
from odradek.coordinator.records import GroupRecord, OffsetAndMetadata, OffsetRecord, TxnOffsetRecord
from odradek.coordinator.shard import GroupShard, Outcome
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages.offset_commit import (
    OffsetCommitRequest, OffsetCommitResponse, OffsetCommitResponsePartition, OffsetCommitResponseTopic,
)
from odradek.protocol.messages.txn_offset_commit import (
    TxnOffsetCommitRequest, TxnOffsetCommitResponse, TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
)

log = logging.getLogger("odradek.coordinator")

TopicError = Callable[[str | None], ErrorCode]   # the broker's view: UNKNOWN_TOPIC_OR_PARTITION, ...


def validate_commit(group: ClassicGroup | None, member_id: str, instance_id: str | None,
                    generation: int) -> ErrorCode:
    if group is None:
        # No group: only a commit from outside group management may create one.
        return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
    if generation < 0 and group.state == GroupState.EMPTY:
        return ErrorCode.NONE
    if generation >= 0 or member_id or instance_id is not None:
        error = group.validate_member(member_id, instance_id)
        if error:
            return error
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
    elif group.state != GroupState.EMPTY:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if group.state == GroupState.COMPLETING_REBALANCE:
        # A member with the new generation that has not synced yet: let it finish the rebalance.
        return ErrorCode.REBALANCE_IN_PROGRESS
    return ErrorCode.NONE


def commit_offsets(shard: GroupShard, req: OffsetCommitRequest, api_version: int, topic_error: TopicError,
                   now_ms: int) -> Outcome:
    group = shard.group(req.group_id)
    error = validate_commit(group, req.member_id, req.group_instance_id, req.generation_id_or_member_epoch)
    retention = req.retention_time_ms if 2 <= api_version <= 4 else -1
    expire = None if retention == -1 else now_ms + retention
    max_bytes = shard.config.offset_metadata_max_bytes
    out = Outcome()
    topics = []
    for t in req.topics:
        partitions = []
        topic_code = error or topic_error(t.name)
        for p in t.partitions:
            code = topic_code
            metadata = p.committed_metadata if p.committed_metadata is not None else ""
            if not code and len(metadata) > max_bytes:
                code = ErrorCode.OFFSET_METADATA_TOO_LARGE
            if not code:
                commit_ts = p.commit_timestamp if api_version == 1 and p.commit_timestamp != -1 else now_ms
                value = OffsetAndMetadata(p.committed_offset, p.committed_leader_epoch, metadata, commit_ts, expire)
                out.records.append(OffsetRecord(req.group_id, t.name, p.partition_index, value))
            partitions.append(OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code))
        topics.append(OffsetCommitResponseTopic(name=t.name, topic_id=t.topic_id, partitions=partitions))
    if error:
        log.debug("group %s: offset commit by member %s generation %d refused: %s", req.group_id,
                  req.member_id, req.generation_id_or_member_epoch, error.name)
    out.response = OffsetCommitResponse(throttle_time_ms=0, topics=topics)
    return out


def fetch_offsets(shard: GroupShard, group_id: str, topics: list[tuple[str, list[int]]] | None
                  ) -> list[tuple[str, list[tuple[int, OffsetAndMetadata | None]]]]:
    """Committed offsets by topic: those asked for (None where nothing is committed), or with
    `topics` None every offset the group has, topics and partitions sorted."""
    group = shard.group(group_id)
    offsets = group.offsets if group is not None else {}
    if topics is None:
        by_topic: dict[str, list[tuple[int, OffsetAndMetadata | None]]] = {}
        for (topic, partition), o in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append((partition, o))
        return list(by_topic.items())
    return [(topic, [(p, offsets.get((topic, p))) for p in partitions]) for topic, partitions in topics]


def delete_offsets(shard: GroupShard, group_id: str, topics: list[tuple[str, list[int]]],
                   topic_error: TopicError, now_ms: int) -> Outcome:
    """OffsetDelete (KIP-496): response (group error, [(topic, [(partition, error)])])."""
    group = shard.group(group_id)
    if group is None:
        return Outcome((ErrorCode.GROUP_ID_NOT_FOUND, []))
    active = group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE,
                             GroupState.COMPLETING_REBALANCE)
    if active and group.protocol_type != CONSUMER_PROTOCOL_TYPE:
        return Outcome((ErrorCode.NON_EMPTY_GROUP, []))
    subscribed = group.subscribed_topics() if active else set()
    out = Outcome()
    results = []
    for topic, partitions in topics:
        code = topic_error(topic)
        if not code and (subscribed is None or topic in subscribed):
            code = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
        for p in partitions:
            if not code and (topic, p) in group.offsets:
                out.records.append(OffsetRecord(group_id, topic, p, None))
        results.append((topic, [(p, code) for p in partitions]))
    out.response = (ErrorCode.NONE, results)
    return out


def remove_topics(shard: GroupShard, topics: set[str]) -> Outcome:
    """Tombstones for every committed offset of deleted topics, in every group, and for Empty groups
    left with none (Kafka's GroupCoordinator.onPartitionsDeleted): a topic created again under the same
    name starts with no committed offsets."""
    out = Outcome()
    for group in list(shard.groups.values()):
        gone = [(t, p) for (t, p) in group.offsets if t in topics]
        if not gone:
            continue
        for topic, partition in gone:
            out.records.append(OffsetRecord(group.group_id, topic, partition, None))
        log.info("Removed %d offsets of deleted topics from group %s", len(gone), group.group_id)
        if group.state == GroupState.EMPTY and len(gone) == len(group.offsets) and not group.pending_members:
            log.info("Group %s transitioned to Dead in generation %d", group.group_id, group.generation)
            out.records.append(GroupRecord(group.group_id, None))
    return out


EXPIRE_RECORDS_MAX = 2000   # tombstones per batch; the rest go in the next (immediate) run


def expire_offsets(shard: GroupShard, now_ms: int) -> tuple[Outcome, bool]:
    """Tombstones for expired offsets, and for Empty groups left with none; and whether there is
    more to expire (the batch stops after about EXPIRE_RECORDS_MAX records)."""
    out = Outcome()
    retention = shard.config.offsets_retention_ms
    for group in list(shard.groups.values()):
        if len(out.records) >= EXPIRE_RECORDS_MAX:
            return out, True
        consumer = shard.consumer_groups.get(group.group_id)
        if consumer is not None:
            # A consumer group's offsets expire a retention period after their commit, unless a
            # member subscribes to their topic (Kafka's ConsumerGroup.offsetExpirationCondition).
            subscribed = consumer.subscribed_topic_names()
            expired = [tp for tp, o in group.offsets.items() if tp[0] not in subscribed and
                       (now_ms >= o.expire_timestamp_ms if o.expire_timestamp_ms is not None
                        else now_ms - o.commit_timestamp_ms >= retention)]
        else:
            expired = _expired(group, now_ms, retention)
        for topic, partition in expired:
            out.records.append(OffsetRecord(group.group_id, topic, partition, None))
        if expired:
            log.info("Removed %d expired offsets of group %s", len(expired), group.group_id)
        if consumer is not None:
            continue   # an Empty consumer group outlives its offsets, as in Kafka until it is deleted
        if group.state == GroupState.EMPTY and len(expired) == len(group.offsets) \
                and not group.pending_members:
            log.info("Group %s transitioned to Dead in generation %d", group.group_id, group.generation)
            out.records.append(GroupRecord(group.group_id, None))
    return out, False


def _expired(group: ClassicGroup, now_ms: int, retention_ms: int) -> list[tuple[str, int]]:
    if group.state == GroupState.EMPTY and group.protocol_type is not None:
        since_empty = group.state_timestamp_ms
        subscribed: set[str] = set()
        base = (lambda o: since_empty) if since_empty is not None else (lambda o: o.commit_timestamp_ms)
    elif group.protocol_type is None and group.state == GroupState.EMPTY:
        subscribed, base = set(), (lambda o: o.commit_timestamp_ms)
    elif group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.state == GroupState.STABLE:
        topics = group.subscribed_topics()
        if topics is None:
            return []
        subscribed, base = topics, (lambda o: o.commit_timestamp_ms)
    else:
        return []
    out = []
    for (topic, partition), o in group.offsets.items():
        if topic in subscribed:
            continue
        if o.expire_timestamp_ms is not None:
            if now_ms >= o.expire_timestamp_ms:
                out.append((topic, partition))
        elif now_ms - base(o) >= retention_ms:
            out.append((topic, partition))
    return out


def txn_commit_offsets(shard: GroupShard, req: TxnOffsetCommitRequest, api_version: int, topic_error: TopicError,
                       now_ms: int) -> Outcome:
    """TxnOffsetCommit (KIP-98; KIP-447 from v3): the offsets become pending offsets of the producer's
    transaction, committed by its COMMIT marker and dropped by its ABORT marker. A group is created
    if needed; a member id or generation, when given, is checked as Kafka does."""
    group = shard.group(req.group_id)
    error = ErrorCode.NONE
    if group is not None and api_version >= 3:
        instance = req.group_instance_id
        if instance is not None and group.static_members.get(instance, req.member_id) != req.member_id:
            error = ErrorCode.FENCED_INSTANCE_ID
        elif req.member_id and req.member_id not in group.members:
            error = ErrorCode.UNKNOWN_MEMBER_ID
        elif req.generation_id >= 0 and req.generation_id != group.generation:
            error = ErrorCode.ILLEGAL_GENERATION
    max_bytes = shard.config.offset_metadata_max_bytes
    out = Outcome()
    topics = []
    for t in req.topics:
        partitions = []
        topic_code = error or topic_error(t.name)
        for p in t.partitions:
            code = topic_code
            metadata = p.committed_metadata if p.committed_metadata is not None else ""
            if not code and len(metadata) > max_bytes:
                code = ErrorCode.OFFSET_METADATA_TOO_LARGE
            if not code:
                value = OffsetAndMetadata(p.committed_offset, p.committed_leader_epoch, metadata, now_ms, None)
                out.records.append(TxnOffsetRecord(req.producer_id, req.producer_epoch,
                                                   OffsetRecord(req.group_id, t.name, p.partition_index, value)))
            partitions.append(TxnOffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code))
        topics.append(TxnOffsetCommitResponseTopic(name=t.name, partitions=partitions))
    out.response = TxnOffsetCommitResponse(throttle_time_ms=0, topics=topics)
    return out
