"""Topic administration: CreateTopics (19), DeleteTopics (20), CreatePartitions (37) and
DescribeTopicPartitions (75, KIP-966). Seed 003, "CreateTopics API", "DeleteTopics API",
"CreatePartitions API".

Checks, their order, error codes and messages are those of Kafka's controller (ControllerApis and
ReplicationControlManager): duplicate names in one request are INVALID_REQUEST; a manual assignment
needs num_partitions = replication_factor = -1, partitions 0..n-1, registered brokers, no broker twice
and one replication factor; -1 means the broker default (`num.partitions`,
`default.replication.factor`); topic configs are validated as AlterConfigs validates them. From v5 a
created (or validated) topic comes back with its partition count, replication factor and every topic
config with its source.

Differences from Kafka, on purpose:
- The embedded controller applies a change before it answers, so `timeout_ms` never expires and a
  topic is usable as soon as CreateTopics returns (Kafka's controller may still be propagating it).
- Validate-only CreateTopics answers a zero topic id (Kafka's KRaft controller returns a random id that
  no topic will ever have).
- Results come in request order (Kafka's DeleteTopics shuffles them).
Internal topics can be deleted by DeleteTopics, as in Kafka (kafka-topics.sh refuses on its side).

The changes themselves are the controller's (`cluster/controller.py`), one at a time under the
broker's controller lock, each recorded with one atomic store write: a crash leaves every topic absent
or complete, and a failed write (a full disk) is answered with KAFKA_STORAGE_ERROR per topic. Bounds
are Kafka's: a CreateTopics asking for more than 10,000 partitions is refused whole (POLICY_VIOLATION,
"Excessively large number of partitions per request."); CreatePartitions adds at most 10,000
partitions and DeleteTopics deletes at most 10,000 topics per request ("Unable to perform excessively
large batch operation.").
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import NoReturn

from odradek.cluster.controller import EXCESSIVE_BATCH, EXCESSIVE_PARTITIONS, MAX_PARTITIONS_PER_REQUEST, \
    requested_partitions
from odradek.cluster.topics import CLUSTER_METADATA_TOPIC, INTERNAL_TOPICS, TopicImage, TopicInfo, \
    validate_topic_name
from odradek.protocol.codec import ZERO_UUID
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import create_partitions as cp
from odradek.protocol.messages import create_topics as ct
from odradek.protocol.messages import delete_topics as dt
from odradek.protocol.messages import describe_topic_partitions as dtp
from odradek.server.apis.admin_cluster import TOPIC_OPERATIONS, authorized_operations
from odradek.server.config import ConfigError, TopicConfig
from odradek.server.context import RequestContext
from odradek.server.controller_channel import ControllerChannel
from odradek.server.slices import Slices

log = logging.getLogger("odradek.admin")


def _fail(code: ErrorCode, message: str | None = None) -> NoReturn:
    raise KafkaApiError(code, message)


# ------------------------------------------------------------------------------------------ CreateTopics
def _plan_one(ctx: RequestContext, topic: ct.CreatableTopic) -> tuple[TopicInfo, TopicConfig]:
    """The controller's checks in Kafka's order: name, existence, configs, then partitions and
    placement. The topic's name stays reserved until the request is done."""
    controller = ctx.controller.controller
    controller.check_new_name(topic.name)
    nulls = [c.name for c in topic.configs if c.value is None]
    if nulls:
        _fail(ErrorCode.INVALID_CONFIG, f"Null value not supported for topic configs: {','.join(nulls)}")
    configs = {c.name: c.value for c in topic.configs}
    try:
        effective = TopicConfig.resolve(configs, ctx.config)
    except ConfigError as e:
        _fail(ErrorCode.INVALID_CONFIG, str(e))
    assignments = [(a.partition_index, list(a.broker_ids)) for a in topic.assignments] or None
    info = controller.plan_topic(topic.name, topic.num_partitions, topic.replication_factor, assignments,
                                 configs, ctx.metadata.image.live_broker_racks(), ctx.controller.topic_defaults())
    return info, effective


def _created(info: TopicInfo, effective: TopicConfig, validate_only: bool, version: int) -> ct.CreatableTopicResult:
    result = ct.CreatableTopicResult(name=info.name, topic_id=ZERO_UUID if validate_only else info.topic_id,
                                     error_code=ErrorCode.NONE, error_message=None)
    if version >= 5:
        result.num_partitions = len(info.partitions)
        result.replication_factor = info.replication_factor
        result.configs = [ct.CreatableTopicConfigs(
            name=e.name, value=None if e.sensitive else e.value_string, read_only=e.read_only,
            config_source=int(e.source), is_sensitive=e.sensitive) for e in effective.describe()]
    return result


def _error(name: str, e: KafkaApiError) -> ct.CreatableTopicResult:
    return ct.CreatableTopicResult(name=name, error_code=e.code, error_message=e.detail)


async def _create(ctx: RequestContext, candidates: list[ct.CreatableTopic], results: dict, validate_only: bool,
                  version: int) -> None:
    """Plan every candidate, then create the planned ones together; fills `results`."""
    channel = ctx.controller
    async with channel.lock:
        await channel.retry_pending_deletions()
        planned = []
        slices = Slices()
        try:
            for topic in candidates:
                await slices.pause()
                try:
                    planned.append(_plan_one(ctx, topic))
                except KafkaApiError as e:
                    results[topic.name] = _error(topic.name, e)
            if planned and not validate_only:
                await channel.create_topics([info for info, _ in planned])
        except KafkaApiError as e:
            for info, _ in planned:
                results[info.name] = _error(info.name, e)
            planned = []
        finally:
            channel.controller.release(info.name for info, _ in planned)
        for info, effective in planned:
            results[info.name] = _created(info, effective, validate_only, version)


async def handle_create_topics(ctx: RequestContext, request: ct.CreateTopicsRequest) -> ct.CreateTopicsResponse:
    v = ctx.api_version
    validate_only = request.validate_only if v >= 1 else False
    if not ctx.controller.is_active:       # a cluster's topic changes are the controller's (Kafka < 2.8)
        return ct.CreateTopicsResponse(throttle_time_ms=0, topics=[
            _error(t.name, KafkaApiError(ErrorCode.NOT_CONTROLLER)) for t in request.topics])
    counts = Counter(t.name for t in request.topics)
    results: dict[str, ct.CreatableTopicResult | None] = {}
    candidates: list[ct.CreatableTopic] = []
    for topic in request.topics:
        if topic.name in results:
            continue
        results[topic.name] = None
        if counts[topic.name] > 1:
            results[topic.name] = _error(topic.name, KafkaApiError(ErrorCode.INVALID_REQUEST, "Duplicate topic name."))
        elif topic.name == CLUSTER_METADATA_TOPIC:
            results[topic.name] = _error(topic.name, KafkaApiError(
                ErrorCode.INVALID_REQUEST, f"Creation of internal topic {CLUSTER_METADATA_TOPIC} is prohibited."))
        else:
            candidates.append(topic)
    default_partitions = ctx.controller.topic_defaults()[0]
    total = sum(requested_partitions(t.num_partitions, len(t.assignments), default_partitions) for t in candidates)
    if total > MAX_PARTITIONS_PER_REQUEST:
        # Kafka's controller refuses the whole request before looking at any topic.
        for topic in candidates:
            results[topic.name] = _error(topic.name, KafkaApiError(ErrorCode.POLICY_VIOLATION, EXCESSIVE_PARTITIONS))
        candidates = []
    if candidates:
        await ctx.controller.call(_create, ctx, candidates, results, validate_only, v)
    return ct.CreateTopicsResponse(throttle_time_ms=0, topics=list(results.values()))


# ------------------------------------------------------------------------------------------ DeleteTopics
def _deletion_plan(image: TopicImage, entries: list[tuple[str | None, uuid.UUID]]) -> list:
    """One item per answer, in request order: a DeletableTopicResult for a rejected entry, or the
    TopicInfo of a topic to delete. The checks are ControllerApis.deleteTopics'."""
    plan: list = []

    def reject(name: str | None, topic_id: uuid.UUID, code: ErrorCode, message: str | None = None) -> None:
        plan.append(dt.DeletableTopicResult(name=name, topic_id=topic_id, error_code=code,
                                            error_message=message if message is not None else code.message))

    names = Counter(n for n, i in entries if n is not None and i == ZERO_UUID)
    ids = Counter(i for n, i in entries if n is None and i != ZERO_UUID)
    duplicates_reported: set = set()
    targets: dict = {}  # topic id -> its place in the plan
    for name, topic_id in entries:
        if name is None and topic_id == ZERO_UUID:
            reject(None, ZERO_UUID, ErrorCode.INVALID_REQUEST, "Neither topic name nor id were specified.")
            continue
        if name is not None and topic_id != ZERO_UUID:
            reject(name, topic_id, ErrorCode.INVALID_REQUEST, "You may not specify both topic name and topic id.")
            continue
        key = name if name is not None else topic_id
        if (names[name] if name is not None else ids[topic_id]) > 1:
            if key not in duplicates_reported:
                duplicates_reported.add(key)
                if name is not None:
                    reject(name, ZERO_UUID, ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
                else:
                    reject(None, topic_id, ErrorCode.INVALID_REQUEST, "Duplicate topic id.")
            continue
        info = image.get(name) if name is not None else image.by_id(topic_id)
        if info is None:
            if name is not None:
                reject(name, ZERO_UUID, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            else:
                reject(None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID)
        elif info.topic_id in targets or ids[info.topic_id] > 1:
            # A name and an id of the same topic: Kafka rejects the name and deletes neither.
            if info.topic_id in targets:
                plan[targets.pop(info.topic_id)] = None
            reject(info.name, info.topic_id, ErrorCode.INVALID_REQUEST,
                   "The provided topic name maps to an ID that was already supplied.")
        else:
            targets[info.topic_id] = len(plan)
            plan.append(info)
    return [item for item in plan if item is not None]


def _deleted(info: TopicInfo, error: KafkaApiError | None) -> dt.DeletableTopicResult:
    if error is None:
        return dt.DeletableTopicResult(name=info.name, topic_id=info.topic_id, error_code=ErrorCode.NONE,
                                       error_message=None)
    return dt.DeletableTopicResult(name=info.name, topic_id=info.topic_id, error_code=error.code,
                                   error_message=error.detail)


async def _delete(channel: ControllerChannel, entries: list) -> tuple[list, KafkaApiError | None]:
    async with channel.lock:
        await channel.retry_pending_deletions()
        plan = _deletion_plan(channel.controller.image, entries)
        doomed = [item for item in plan if isinstance(item, TopicInfo)]
        if doomed:
            try:
                await channel.delete_topics(doomed)
            except KafkaApiError as e:
                return plan, e
        return plan, None


async def handle_delete_topics(ctx: RequestContext, request: dt.DeleteTopicsRequest) -> dt.DeleteTopicsResponse:
    v = ctx.api_version
    if v >= 6:
        entries = [(t.name, t.topic_id) for t in request.topics]
    else:
        entries = [(name, ZERO_UUID) for name in request.topic_names]
    if not ctx.controller.is_active:
        return dt.DeleteTopicsResponse(throttle_time_ms=0, responses=[
            dt.DeletableTopicResult(name=n, topic_id=i, error_code=ErrorCode.NOT_CONTROLLER,
                                    error_message=ErrorCode.NOT_CONTROLLER.message) for n, i in entries])
    if not ctx.config.get("delete.topic.enable"):
        code = ErrorCode.INVALID_REQUEST if v < 3 else ErrorCode.TOPIC_DELETION_DISABLED
        return dt.DeleteTopicsResponse(throttle_time_ms=0, responses=[
            dt.DeletableTopicResult(name=n, topic_id=i, error_code=code, error_message="Topic deletion is disabled.")
            for n, i in entries])
    if len(entries) > MAX_PARTITIONS_PER_REQUEST:
        # Kafka's controller writes one record per topic and refuses more than 10,000 records.
        return dt.DeleteTopicsResponse(throttle_time_ms=0, responses=[
            dt.DeletableTopicResult(name=n, topic_id=i, error_code=ErrorCode.POLICY_VIOLATION,
                                    error_message=EXCESSIVE_BATCH) for n, i in entries])
    plan, error = await ctx.controller.call(_delete, ctx.controller, entries)
    results = [_deleted(item, error) if isinstance(item, TopicInfo) else item for item in plan]
    return dt.DeleteTopicsResponse(throttle_time_ms=0, responses=results)


# ------------------------------------------------------------------------------------------ CreatePartitions
def _cp_error(name: str, e: KafkaApiError) -> cp.CreatePartitionsTopicResult:
    # Kafka's UnknownTopicOrPartitionException there carries no message.
    message = None if e.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION else e.detail
    return cp.CreatePartitionsTopicResult(name=name, error_code=e.code, error_message=message)


async def _add_partitions(ctx: RequestContext, topics: list[cp.CreatePartitionsTopic],
                          validate_only: bool) -> dict[str, cp.CreatePartitionsTopicResult]:
    counts = Counter(t.name for t in topics)
    results: dict[str, cp.CreatePartitionsTopicResult] = {}
    channel = ctx.controller
    live = ctx.metadata.image.live_broker_racks()
    async with channel.lock:
        await channel.retry_pending_deletions()
        plans: list[tuple[TopicInfo, TopicInfo]] = []
        budget = MAX_PARTITIONS_PER_REQUEST
        for topic in topics:
            if topic.name in results:
                continue
            try:
                if counts[topic.name] > 1:
                    _fail(ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
                assignments = None if topic.assignments is None else [list(a.broker_ids) for a in topic.assignments]
                new = channel.controller.plan_partitions(topic.name, topic.count, assignments, live)
                old = channel.controller.image.get(topic.name)
                assert old is not None   # planned against it
                added = len(new.partitions) - len(old.partitions)
                if added > budget:
                    _fail(ErrorCode.POLICY_VIOLATION, EXCESSIVE_BATCH)
                budget -= added
                plans.append((old, new))
                results[topic.name] = cp.CreatePartitionsTopicResult(name=topic.name, error_code=ErrorCode.NONE,
                                                                     error_message=None)
            except KafkaApiError as e:
                results[topic.name] = _cp_error(topic.name, e)
        if plans and not validate_only:
            try:
                await channel.add_partitions(plans)
            except KafkaApiError as e:
                for old, _ in plans:
                    results[old.name] = _cp_error(old.name, e)
    return results


async def handle_create_partitions(ctx: RequestContext,
                                   request: cp.CreatePartitionsRequest) -> cp.CreatePartitionsResponse:
    if not ctx.controller.is_active:
        return cp.CreatePartitionsResponse(throttle_time_ms=0, results=[
            _cp_error(t.name, KafkaApiError(ErrorCode.NOT_CONTROLLER, ErrorCode.NOT_CONTROLLER.message))
            for t in request.topics])
    results = await ctx.controller.call(_add_partitions, ctx, request.topics, request.validate_only)
    return cp.CreatePartitionsResponse(throttle_time_ms=0, results=list(results.values()))


# ------------------------------------------------------------------------------------------ DescribeTopicPartitions
def _partition_page(live: frozenset[int], info: TopicInfo, start: int, limit: int) -> tuple[list, int]:
    """Partitions [start, start + limit) of a topic and the next index (-1 when the topic is done)."""
    count = len(info.partitions)
    upper = min(count, start + limit)
    out = []
    for p in range(start, upper):
        st = info.partitions.get(p)
        if st is None:
            continue
        out.append(dtp.DescribeTopicPartitionsResponsePartition(
            error_code=ErrorCode.NONE, partition_index=p, leader_id=st.leader if st.leader in live else -1,
            leader_epoch=st.leader_epoch, replica_nodes=list(st.replicas), isr_nodes=list(st.isr),
            eligible_leader_replicas=[], last_known_elr=[],
            offline_replicas=[r for r in st.replicas if r not in live]))
    return out, (upper if upper < count else -1)


def _error_topic(name: str, code: ErrorCode) -> dtp.DescribeTopicPartitionsResponseTopic:
    return dtp.DescribeTopicPartitionsResponseTopic(error_code=code, name=name, topic_id=ZERO_UUID,
                                                    is_internal=name in INTERNAL_TOPICS, partitions=[])


async def handle_describe_topic_partitions(ctx: RequestContext, request: dtp.DescribeTopicPartitionsRequest
                                           ) -> dtp.DescribeTopicPartitionsResponse:
    """Kafka's DescribeTopicPartitionsRequestHandler: topics in name order from the cursor on, at most
    min(response_partition_limit, max.request.partition.size.limit) partitions (at least 1); the
    cursor of the response points at the first partition not returned."""
    image = ctx.metadata.image
    cursor = request.cursor
    cursor_topic = cursor.topic_name if cursor is not None else ""
    fetch_all = not request.topics
    if fetch_all:
        names = [n for n in image.topic_names() if n >= cursor_topic]
    else:
        names = sorted({t.name for t in request.topics if t.name >= cursor_topic})
        if cursor is not None and cursor.topic_name not in names:
            return _invalid(request, "DescribeTopicPartitionsRequest topic list should contain the cursor topic: "
                                     f"{cursor.topic_name}")
    if cursor is not None and cursor.partition_index < 0:
        return _invalid(request, "DescribeTopicPartitionsRequest cursor partition must be valid")
    remaining = max(min(ctx.config.get("max.request.partition.size.limit"), request.response_partition_limit), 1)
    topics, next_cursor = [], None
    for name in sorted(names):
        if remaining == 0:
            next_cursor = dtp.Cursor(topic_name=name, partition_index=0)
            break
        info = image.topic(name)
        if info is None:
            if not fetch_all:
                reason = validate_topic_name(name)
                topics.append(_error_topic(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if reason is None
                                           else ErrorCode.INVALID_TOPIC_EXCEPTION))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor_topic else 0
        partitions, next_index = _partition_page(image.live_broker_ids(), info, start, remaining)
        topics.append(dtp.DescribeTopicPartitionsResponseTopic(
            error_code=ErrorCode.NONE, name=name, topic_id=info.topic_id, is_internal=info.is_internal,
            partitions=partitions))
        if next_index != -1:
            next_cursor = dtp.Cursor(topic_name=name, partition_index=next_index)
            break
        remaining -= len(partitions)
    operations = authorized_operations(ctx, TOPIC_OPERATIONS)
    for t in topics:
        t.topic_authorized_operations = operations
    return dtp.DescribeTopicPartitionsResponse(throttle_time_ms=0, topics=topics, next_cursor=next_cursor)


def _invalid(request: dtp.DescribeTopicPartitionsRequest, message: str) -> dtp.DescribeTopicPartitionsResponse:
    # Kafka answers a request-level error on every requested topic; the response has no message field.
    log.info("DescribeTopicPartitions: %s", message)
    return dtp.DescribeTopicPartitionsResponse(
        throttle_time_ms=0, topics=[dtp.DescribeTopicPartitionsResponseTopic(
            error_code=ErrorCode.INVALID_REQUEST, name=t.name, topic_id=ZERO_UUID, is_internal=False, partitions=[])
            for t in request.topics])
