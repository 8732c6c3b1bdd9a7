"""Offset APIs: OffsetCommit (8), OffsetFetch (9), OffsetDelete (47) (seed 003, "Consumer Position"
and "OffsetCommit API" / "OffsetFetch API"; seed 004, "Offset Commit/Fetch API").

The coordinator works on topic names; here v10 topic ids are resolved to names (UNKNOWN_TOPIC_ID when
there is none) and topics this cluster does not have are refused per partition with
UNKNOWN_TOPIC_OR_PARTITION, as Kafka does before it asks its coordinator. OffsetFetch answers with
offset -1 and empty metadata where nothing is committed; v8+ may ask for several groups at once, and a
null topic list asks for every offset the group has.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, TypeVar

from odradek.coordinator import consumer_admin
from odradek.coordinator import offsets as ops
from odradek.coordinator.records import OffsetAndMetadata
from odradek.coordinator.runtime import CoordinatorError
from odradek.protocol.codec import ZERO_UUID
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import offset_commit as oc
from odradek.protocol.messages import offset_delete as od
from odradek.protocol.messages import offset_fetch as of
from odradek.server.apis.groups import coordinator_of, run
from odradek.server.context import RequestContext
from odradek.server.metadata_cache import MetadataImage

P = TypeVar("P", of.OffsetFetchResponsePartition, of.OffsetFetchResponsePartitions)

NO_OFFSET = -1


def _topic_error(image: MetadataImage, use_ids: bool) -> Callable[[str | None], ErrorCode]:
    def error(name: str | None) -> ErrorCode:
        if name is None:
            return ErrorCode.UNKNOWN_TOPIC_ID if use_ids else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.NONE if image.topic(name) is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return error


def _name_of(image: MetadataImage, topic_id: uuid.UUID) -> str | None:
    info = image.topic_by_id(topic_id)
    return info.name if info is not None else None


def _id_of(image: MetadataImage, name: str) -> uuid.UUID:
    info = image.topic(name)
    return info.topic_id if info is not None else ZERO_UUID


# ------------------------------------------------------------------------------------ OffsetCommit
def _missing_code(image: MetadataImage, name: str | None, index: int, use_ids: bool) -> ErrorCode:
    """NONE when the partition exists, else the error Kafka answers for it before any group check."""
    if name is None:
        return ErrorCode.UNKNOWN_TOPIC_ID if use_ids else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    info = image.topic(name)
    return ErrorCode.NONE if info is not None and index in info.partitions else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def handle_offset_commit(ctx: RequestContext, request: oc.OffsetCommitRequest) -> oc.OffsetCommitResponse:
    """Partitions this cluster does not have are answered UNKNOWN_TOPIC_OR_PARTITION (UNKNOWN_TOPIC_ID for
    v10 ids) and never reach the coordinator, so nothing is stored for them, whatever the group says
    about the rest (Kafka's KafkaApis.handleOffsetCommitRequest)."""
    image = ctx.metadata.image
    v = ctx.api_version
    if v >= 10:
        for t in request.topics:
            t.name = _name_of(image, t.topic_id)
    asked = request.topics
    refused = {(i, j): code for i, t in enumerate(asked) for j, p in enumerate(t.partitions)
               if (code := _missing_code(image, t.name, p.partition_index, v >= 10))}
    request.topics = [oc.OffsetCommitRequestTopic(name=t.name, topic_id=t.topic_id, partitions=kept)
                      for i, t in enumerate(asked)
                      if (kept := [p for j, p in enumerate(t.partitions) if (i, j) not in refused])]
    answered: list = []
    if request.topics:
        try:
            response = await run(ctx, request.group_id, consumer_admin.commit_offsets, request, v,
                                 _topic_error(image, v >= 10))
            answered = [p.error_code for t in response.topics for p in t.partitions]
        except CoordinatorError as e:
            answered = [e.code for t in request.topics for _ in t.partitions]
    codes = iter(answered)
    return oc.OffsetCommitResponse(throttle_time_ms=0, topics=[
        oc.OffsetCommitResponseTopic(name=t.name, topic_id=t.topic_id, partitions=[
            oc.OffsetCommitResponsePartition(partition_index=p.partition_index,
                                             error_code=refused[(i, j)] if (i, j) in refused else next(codes))
            for j, p in enumerate(t.partitions)]) for i, t in enumerate(asked)])


# ------------------------------------------------------------------------------------ OffsetFetch
def _fetch(ctx: RequestContext, group_id: str, topics: list[tuple[str, list[int]]] | None,
           member_id: str | None = None, member_epoch: int = -1
           ) -> tuple[ErrorCode, list[tuple[str, list[tuple[int, Any]]]]]:
    """Committed offsets; from v9 a consumer group's member must be at its current epoch."""
    try:
        return coordinator_of(ctx).query(group_id, consumer_admin.fetch_offsets, group_id, member_id, member_epoch,
                                         topics)
    except CoordinatorError as e:
        return e.code, []


def _partition(cls: type[P], partition: int, o: OffsetAndMetadata | None, code: ErrorCode = ErrorCode.NONE) -> P:
    if o is None:
        return cls(partition_index=partition, committed_offset=NO_OFFSET, committed_leader_epoch=-1,
                   metadata="", error_code=code)
    return cls(partition_index=partition, committed_offset=o.offset, committed_leader_epoch=o.leader_epoch,
               metadata=o.metadata, error_code=code)


async def handle_offset_fetch(ctx: RequestContext, request: of.OffsetFetchRequest) -> of.OffsetFetchResponse:
    v = ctx.api_version
    if v < 8:
        topics = None if request.topics is None else [(t.name, list(t.partition_indexes)) for t in request.topics]
        code, found = _fetch(ctx, request.group_id, topics)
        if code and v < 2:
            # No group-level error field before v2: every partition carries it.
            found = [(name, [(p, None) for p in parts]) for name, parts in topics or []]
        unstable = _unstable(ctx, request.group_id, found) if v >= 7 and request.require_stable else set()
        out = [of.OffsetFetchResponseTopic(name=name, partitions=[
            _partition(of.OffsetFetchResponsePartition, p, None, ErrorCode.UNSTABLE_OFFSET_COMMIT)
            if (name, p) in unstable else
            _partition(of.OffsetFetchResponsePartition, p, o, code if v < 2 else ErrorCode.NONE)
            for p, o in parts]) for name, parts in found]
        return of.OffsetFetchResponse(throttle_time_ms=0, topics=out, error_code=code)
    image = ctx.metadata.image
    return of.OffsetFetchResponse(throttle_time_ms=0, groups=[_fetch_group(ctx, image, g, request.require_stable)
                                                              for g in request.groups])


def _unstable(ctx: RequestContext, group_id: str, found: list) -> set[tuple[str, int]]:
    """KIP-447 (require_stable): partitions with offsets pending in an open transaction, answered
    UNSTABLE_OFFSET_COMMIT so the consumer retries instead of starting from a stale offset."""
    try:
        return coordinator_of(ctx).query(group_id, lambda shard: {
            (name, p) for name, parts in found for p, _ in parts
            if shard.has_pending_txn_offsets(group_id, name, p)})
    except CoordinatorError:
        return set()


def _fetch_group(ctx: RequestContext, image: MetadataImage, g: of.OffsetFetchRequestGroup,
                 require_stable: bool = False) -> of.OffsetFetchResponseGroup:
    """One group of an OffsetFetch v8+."""
    v = ctx.api_version
    topics: list[tuple[str | None, list[int]]] | None
    if g.topics is None:
        topics = None
    elif v >= 10:
        topics = [(_name_of(image, t.topic_id), list(t.partition_indexes)) for t in g.topics]
    else:
        topics = [(t.name, list(t.partition_indexes)) for t in g.topics]
    named = None if topics is None else [(n, ps) for n, ps in topics if n is not None]
    code, found = _fetch(ctx, g.group_id, named, g.member_id, g.member_epoch)
    unstable = _unstable(ctx, g.group_id, found) if require_stable else set()
    out = [of.OffsetFetchResponseTopics(name=name, topic_id=_id_of(image, name) if v >= 10 else ZERO_UUID,
                                        partitions=[_partition(of.OffsetFetchResponsePartitions, p, None,
                                                               ErrorCode.UNSTABLE_OFFSET_COMMIT)
                                                    if (name, p) in unstable else
                                                    _partition(of.OffsetFetchResponsePartitions, p, o)
                                                    for p, o in parts])
           for name, parts in found]
    if v >= 10 and topics and not code:
        for (name, indexes), t in zip(topics, g.topics):
            if name is None:
                out.append(of.OffsetFetchResponseTopics(topic_id=t.topic_id, partitions=[
                    _partition(of.OffsetFetchResponsePartitions, p, None, ErrorCode.UNKNOWN_TOPIC_ID)
                    for p in indexes]))
    return of.OffsetFetchResponseGroup(group_id=g.group_id, topics=out, error_code=code)


# ------------------------------------------------------------------------------------ OffsetDelete
async def handle_offset_delete(ctx: RequestContext, request: od.OffsetDeleteRequest) -> od.OffsetDeleteResponse:
    """As for OffsetCommit, partitions this cluster does not have are answered here, per partition."""
    image = ctx.metadata.image
    refused = {(t.name, p.partition_index): code for t in request.topics for p in t.partitions
               if (code := _missing_code(image, t.name, p.partition_index, False))}
    topics = [(t.name, kept) for t in request.topics
              if (kept := [p.partition_index for p in t.partitions if (t.name, p.partition_index) not in refused])]
    try:   # even with nothing left to delete: the group's own errors are answered (GROUP_ID_NOT_FOUND)
        code, results = await run(ctx, request.group_id, consumer_admin.delete_offsets, request.group_id, topics,
                                  _topic_error(image, False))
    except CoordinatorError as e:
        code, results = e.code, []
    answered = {(name, p): c for name, parts in results for p, c in parts}
    out = []
    for t in request.topics:
        keys = [(t.name, p.partition_index) for p in t.partitions]
        parts = [(index, refused.get((name, index), answered.get((name, index)))) for name, index in keys]
        parts = [(p, c) for p, c in parts if c is not None]
        if parts:
            out.append(od.OffsetDeleteResponseTopic(name=t.name, partitions=[
                od.OffsetDeleteResponsePartition(partition_index=p, error_code=c) for p, c in parts]))
    return od.OffsetDeleteResponse(error_code=code, throttle_time_ms=0, topics=out)
