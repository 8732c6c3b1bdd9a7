"""Consumer groups seen through the other group APIs (seed 002, KIP-848: "ConsumerGroupDescribe",
the GroupType of ListGroups, and the member epoch that fences offset commits and fetches).

- ConsumerGroupDescribe (69): epochs, the assignor (the client-side assignor that computed the
  current target when one did, else the server-side assignor the members prefer), each member's
  subscription, current and target assignment (topic ids with their names); GROUP_ID_NOT_FOUND for
  unknown and classic groups.
- ListGroups v5: consumer groups with group type "consumer", protocol type "consumer".
- DescribeGroups on a consumer group answers as for an unknown group (Dead; GROUP_ID_NOT_FOUND from
  v6, see `server/apis/groups.py`), as Kafka does: that API describes classic groups.
- DeleteGroups: only an Empty consumer group; its records and offsets get tombstones.
- JoinGroup, SyncGroup, Heartbeat, LeaveGroup on a consumer group: see `consumer_classic`.
- OffsetDelete: GROUP_SUBSCRIBED_TO_TOPIC for a topic some member subscribes to.
- OffsetCommit: a consumer group accepts a commit from a member at its current epoch (STALE_MEMBER_EPOCH
  otherwise, UNKNOWN_MEMBER_ID for a stranger, UNSUPPORTED_VERSION below v9), or with epoch -1 when it
  has no members (tools, `assign()` consumers). A classic member commits with its generation, the
  member epoch (ILLEGAL_GENERATION otherwise), at any version. OffsetFetch v9+ with a member id checks the same epoch.
"""

from __future__ import annotations

import logging

from odradek.coordinator import offsets as offs
from odradek.coordinator.admin import (
    AUTHORIZED_OPERATIONS_OMITTED, GROUP_AUTHORIZED_OPERATIONS, delete_group as delete_classic, describe_group,
)
from odradek.coordinator.consumer_group import (
    CONSUMER_GROUP_TYPE, ConsumerGroup, ConsumerGroupState, TopicsView,
)
from odradek.coordinator.consumer_heartbeat import preferred_assignor
from odradek.coordinator.consumer_migration import group_tombstones
from odradek.coordinator.consumer_records import Partitions
from odradek.coordinator.records import OffsetAndMetadata, OffsetRecord, Record
from odradek.coordinator.shard import GroupShard, Outcome
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_group_describe as cgd
from odradek.protocol.messages.describe_groups import DescribedGroup
from odradek.protocol.messages.list_groups import ListedGroup
from odradek.protocol.messages.offset_commit import (
    OffsetCommitRequest, OffsetCommitResponse, OffsetCommitResponsePartition, OffsetCommitResponseTopic,
)

log = logging.getLogger("odradek.coordinator")

CONSUMER_MEMBER_TYPE = 1   # KIP-1099: a member using the consumer protocol
CLASSIC_MEMBER_TYPE = 0    # a member that joined with JoinGroup (online migration)
OFFSET_COMMIT_MIN_VERSION = 9


# ------------------------------------------------------------------------------------------ describe
def _assignment(parts: Partitions, topics: TopicsView) -> cgd.Assignment:
    return cgd.Assignment(topic_partitions=[
        cgd.TopicPartitions(topic_id=t, topic_name=topics.name_of(t) or "", partitions=sorted(ps))
        for t, ps in sorted(parts.items(), key=lambda kv: str(kv[0]))])


def describe(shard: GroupShard, group_id: str, include_authorized_operations: bool,
             topics: TopicsView, assignors: tuple[str, ...]) -> cgd.DescribedGroup:
    g = shard.consumer_groups.get(group_id)
    if g is None:
        classic = shard.group(group_id)
        message = f"Group {group_id} is not a consumer group." if classic is not None \
            and classic.protocol_type is not None else f"Group {group_id} not found."
        return cgd.DescribedGroup(error_code=ErrorCode.GROUP_ID_NOT_FOUND, error_message=message, group_id=group_id)
    members = [cgd.Member(
        member_id=m.member_id, instance_id=m.instance_id, rack_id=m.subscription.rack_id,
        member_epoch=m.member_epoch, client_id=m.subscription.client_id, client_host=m.subscription.client_host,
        subscribed_topic_names=list(m.subscription.subscribed_topic_names),
        subscribed_topic_regex=m.subscription.subscribed_topic_regex,
        assignment=_assignment(m.assigned, topics), target_assignment=_assignment(g.target.get(m.member_id, {}), topics),
        member_type=CLASSIC_MEMBER_TYPE if m.uses_classic_protocol else CONSUMER_MEMBER_TYPE)
        for m in g.members.values()]
    return cgd.DescribedGroup(
        error_code=ErrorCode.NONE, group_id=group_id, group_state=g.state().value, group_epoch=g.group_epoch,
        assignment_epoch=g.assignment_epoch,
        assignor_name=g.target_assignor or preferred_assignor(g.members, assignors), members=members,
        authorized_operations=GROUP_AUTHORIZED_OPERATIONS if include_authorized_operations
        else AUTHORIZED_OPERATIONS_OMITTED)


def describe_classic(shard: GroupShard, group_id: str, include_authorized_operations: bool) -> DescribedGroup:
    """DescribeGroups: a consumer group is not a classic group."""
    if group_id in shard.consumer_groups:
        return DescribedGroup(error_code=ErrorCode.NONE, group_id=group_id, group_state=ConsumerGroupState.DEAD.value,
                              protocol_type="", protocol_data="", members=[])
    return describe_group(shard, group_id, include_authorized_operations)


def list_groups(shard: GroupShard, states: set[str], types: set[str]) -> list[ListedGroup]:
    if types and CONSUMER_GROUP_TYPE not in types:
        return []
    out = []
    for gid, g in sorted(shard.consumer_groups.items()):
        state = g.state().value
        if states and state.lower() not in states:
            continue
        out.append(ListedGroup(group_id=gid, protocol_type=CONSUMER_GROUP_TYPE, group_state=state,
                               group_type=CONSUMER_GROUP_TYPE))
    return out


def delete_group(shard: GroupShard, group_id: str, now_ms: int) -> Outcome:
    g = shard.consumer_groups.get(group_id)
    if g is None:
        return delete_classic(shard, group_id, now_ms)
    if g.members:
        return Outcome(ErrorCode.NON_EMPTY_GROUP)
    holder = shard.group(group_id)
    offsets = sorted(holder.offsets) if holder is not None else []
    records: list[Record] = [OffsetRecord(group_id, t, p, None) for t, p in offsets]
    records += group_tombstones(g)
    log.info("Deleting consumer group %s with %d committed offsets", group_id, len(offsets))
    return Outcome(ErrorCode.NONE, records=records)


# ------------------------------------------------------------------------------------------ offsets
def validate_commit(g: ConsumerGroup, member_id: str, member_epoch: int, api_version: int) -> ErrorCode:
    if member_epoch < 0 and not g.members:
        return ErrorCode.NONE
    member = g.members.get(member_id)
    if member is None:
        return ErrorCode.UNKNOWN_MEMBER_ID
    if member.uses_classic_protocol:
        return ErrorCode.NONE if member_epoch == member.member_epoch else ErrorCode.ILLEGAL_GENERATION
    if api_version < OFFSET_COMMIT_MIN_VERSION:
        return ErrorCode.UNSUPPORTED_VERSION
    if member_epoch != member.member_epoch:
        return ErrorCode.STALE_MEMBER_EPOCH
    return ErrorCode.NONE


def commit_offsets(shard: GroupShard, req: OffsetCommitRequest, api_version: int, topic_error: offs.TopicError,
                   now_ms: int) -> Outcome:
    g = shard.consumer_groups.get(req.group_id)
    if g is None:
        return offs.commit_offsets(shard, req, api_version, topic_error, now_ms)
    error = validate_commit(g, req.member_id, req.generation_id_or_member_epoch, api_version)
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
                out.records.append(OffsetRecord(req.group_id, t.name, p.partition_index, value))
            partitions.append(OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code))
        topics.append(OffsetCommitResponseTopic(name=t.name, topic_id=t.topic_id, partitions=partitions))
    if error:
        log.debug("group %s: offset commit by member %s epoch %d refused: %s", req.group_id, req.member_id,
                  req.generation_id_or_member_epoch, error.name)
    out.response = OffsetCommitResponse(throttle_time_ms=0, topics=topics)
    return out


def delete_offsets(shard: GroupShard, group_id: str, topics: list[tuple[str, list[int]]],
                   topic_error: offs.TopicError, now_ms: int) -> Outcome:
    """OffsetDelete: a consumer group refuses GROUP_SUBSCRIBED_TO_TOPIC for a topic a member subscribes to."""
    g = shard.consumer_groups.get(group_id)
    if g is None:
        return offs.delete_offsets(shard, group_id, topics, topic_error, now_ms)
    subscribed = g.subscribed_topic_names()

    def error(name: str | None) -> ErrorCode:
        code = topic_error(name)
        return ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if not code and name in subscribed else code
    return offs.delete_offsets(shard, group_id, topics, error, now_ms)


def fetch_offsets(shard: GroupShard, group_id: str, member_id: str | None, member_epoch: int,
                  topics: list[tuple[str, list[int]]] | None
                  ) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, OffsetAndMetadata | None]]]]]:
    """OffsetFetch v9+: (group error, offsets by topic)."""
    g = shard.consumer_groups.get(group_id)
    if g is not None and not (member_id is None and member_epoch < 0):
        member = g.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID, []
        if member_epoch != member.member_epoch:
            return ErrorCode.STALE_MEMBER_EPOCH, []
    return ErrorCode.NONE, offs.fetch_offsets(shard, group_id, topics)

