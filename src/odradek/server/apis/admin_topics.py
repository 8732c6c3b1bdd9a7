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
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import NoReturn

from odradek.cluster.topics import INTERNAL_TOPICS, assign_replicas, validate_topic_name
from odradek.protocol.codec import ZERO_UUID
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import create_partitions as cp
from odradek.protocol.messages import create_topics as ct
from odradek.protocol.messages import delete_topics as dt
from odradek.protocol.messages import describe_topic_partitions as dtp
from odradek.server.apis.admin_cluster import TOPIC_OPERATIONS, authorized_operations
from odradek.server.config import ConfigError, TopicConfig

log = logging.getLogger("odradek.admin")

CLUSTER_METADATA_TOPIC = "__cluster_metadata"


def _fail(code: ErrorCode, message: str | None = None) -> NoReturn:
    raise KafkaApiError(code, message)


# ------------------------------------------------------------------------------------------ assignment
def check_manual_assignment(broker, replicas: list[int], replication_factor: int | None) -> None:
    """ReplicationControlManager.validateManualPartitionAssignment."""
    if not replicas:
        _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
              "The manual partition assignment includes an empty replica list.")
    live = broker.live_broker_ids()
    previous = None
    for broker_id in sorted(replicas):
        if broker_id not in live:
            _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"The manual partition assignment includes broker "
                                                        f"{broker_id}, but no such broker is registered.")
        if broker_id == previous:
            _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                  f"The manual partition assignment includes the broker {previous} more than once.")
        previous = broker_id
    if replication_factor is not None and len(replicas) != replication_factor:
        _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
              f"The manual partition assignment includes a partition with {len(replicas)} replica(s), but "
              f"this is not consistent with previous partitions, which have {replication_factor} replica(s).")


def place_replicas(broker, partitions: int, replication_factor: int, first_partition: int = 0):
    brokers = sorted(broker.live_broker_ids())
    if replication_factor > len(brokers):
        _fail(ErrorCode.INVALID_REPLICATION_FACTOR,
              f"Unable to replicate the partition {replication_factor} time(s): The target replication "
              f"factor of {replication_factor} cannot be reached because only {len(brokers)} broker(s) "
              f"are registered.")
    return assign_replicas(brokers, partitions, replication_factor, first_partition=first_partition)


# ------------------------------------------------------------------------------------------ CreateTopics
def _planned_assignment(broker, topic: ct.CreatableTopic) -> dict[int, list[int]]:
    if topic.assignments:
        if topic.replication_factor != -1:
            _fail(ErrorCode.INVALID_REQUEST, "A manual partition assignment was specified, but replication "
                                             "factor was not set to -1.")
        if topic.num_partitions != -1:
            _fail(ErrorCode.INVALID_REQUEST, "A manual partition assignment was specified, but numPartitions "
                                             "was not set to -1.")
        assignment: dict[int, list[int]] = {}
        replication_factor = None
        for a in topic.assignments:
            if a.partition_index in assignment:
                _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                      f"Found multiple manual partition assignments for partition {a.partition_index}")
            check_manual_assignment(broker, list(a.broker_ids), replication_factor)
            replication_factor = len(a.broker_ids)
            assignment[a.partition_index] = list(a.broker_ids)
        if any(i not in assignment for i in range(len(assignment))):
            _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partitions should be a consecutive 0-based integer sequence")
        return assignment
    if topic.replication_factor < -1 or topic.replication_factor == 0:
        _fail(ErrorCode.INVALID_REPLICATION_FACTOR,
              "Replication factor must be larger than 0, or -1 to use the default value.")
    if topic.num_partitions < -1 or topic.num_partitions == 0:
        _fail(ErrorCode.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
    partitions = broker.config.get("num.partitions") if topic.num_partitions == -1 else topic.num_partitions
    factor = broker.config.get("default.replication.factor") if topic.replication_factor == -1 \
        else topic.replication_factor
    return place_replicas(broker, partitions, factor)


def _create_one(broker, topic: ct.CreatableTopic, validate_only: bool, version: int) -> ct.CreatableTopicResult:
    name = topic.name
    reason = validate_topic_name(name)
    if reason is not None:
        _fail(ErrorCode.INVALID_TOPIC_EXCEPTION, reason)
    if broker.topics.get(name) is not None:
        _fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
    nulls = [c.name for c in topic.configs if c.value is None]
    if nulls:
        _fail(ErrorCode.INVALID_CONFIG, f"Null value not supported for topic configs: {','.join(nulls)}")
    configs = {c.name: c.value for c in topic.configs}
    try:
        effective = TopicConfig.resolve(configs, broker.config)
    except ConfigError as e:
        _fail(ErrorCode.INVALID_CONFIG, str(e))
    assignment = _planned_assignment(broker, topic)
    info, error, message = broker.create_topic(name, -1, -1, configs, assignment=assignment,
                                               validate_only=validate_only)
    if error != ErrorCode.NONE:
        _fail(error, message)
    result = ct.CreatableTopicResult(name=name, topic_id=info.topic_id if info is not None else ZERO_UUID,
                                     error_code=ErrorCode.NONE, error_message=None)
    if version >= 5:
        result.num_partitions = len(assignment)
        result.replication_factor = len(assignment[0])
        result.configs = [ct.CreatableTopicConfigs(
            name=e.name, value=None if e.sensitive else e.value_string, read_only=e.read_only,
            config_source=int(e.source), is_sensitive=e.sensitive) for e in effective.describe()]
    return result


async def handle_create_topics(ctx, request: ct.CreateTopicsRequest) -> ct.CreateTopicsResponse:
    v = ctx.api_version
    validate_only = request.validate_only if v >= 1 else False
    counts = Counter(t.name for t in request.topics)
    reported: set[str] = set()
    results = []
    for topic in request.topics:
        if topic.name in reported:
            continue
        reported.add(topic.name)
        try:
            if counts[topic.name] > 1:
                _fail(ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
            if topic.name == CLUSTER_METADATA_TOPIC:
                _fail(ErrorCode.INVALID_REQUEST, f"Creation of internal topic {CLUSTER_METADATA_TOPIC} is prohibited.")
            results.append(_create_one(ctx.broker, topic, validate_only, v))
        except KafkaApiError as e:
            results.append(ct.CreatableTopicResult(name=topic.name, error_code=e.code, error_message=e.detail))
    return ct.CreateTopicsResponse(throttle_time_ms=0, topics=results)


# ------------------------------------------------------------------------------------------ DeleteTopics
def _deletion_plan(broker, entries: list[tuple[str | None, object]]) -> list:
    """One item per answer, in request order: a DeletableTopicResult for a rejected entry, or
    (topic_id, name) for a topic to delete. The checks are ControllerApis.deleteTopics'."""
    plan: list = []

    def reject(name, topic_id, code, message=None):
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
        info = broker.topics.get(name) if name is not None else broker.topic_by_id(topic_id)
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
            plan.append((info.topic_id, info.name))
    return [item for item in plan if item is not None]


async def handle_delete_topics(ctx, request: dt.DeleteTopicsRequest) -> dt.DeleteTopicsResponse:
    broker = ctx.broker
    v = ctx.api_version
    if v >= 6:
        entries = [(t.name, t.topic_id) for t in request.topics]
    else:
        entries = [(name, ZERO_UUID) for name in request.topic_names]
    if not broker.config.get("delete.topic.enable"):
        code = ErrorCode.INVALID_REQUEST if v < 3 else ErrorCode.TOPIC_DELETION_DISABLED
        return dt.DeleteTopicsResponse(throttle_time_ms=0, responses=[
            dt.DeletableTopicResult(name=n, topic_id=i, error_code=code, error_message="Topic deletion is disabled.")
            for n, i in entries])
    results = []
    for item in _deletion_plan(broker, entries):
        if isinstance(item, tuple):
            topic_id, name = item
            broker.delete_topic(name)
            item = dt.DeletableTopicResult(name=name, topic_id=topic_id, error_code=ErrorCode.NONE,
                                           error_message=None)
        results.append(item)
    return dt.DeleteTopicsResponse(throttle_time_ms=0, responses=results)


# ------------------------------------------------------------------------------------------ CreatePartitions
def _add_partitions(broker, topic: cp.CreatePartitionsTopic, validate_only: bool) -> None:
    info = broker.topics.get(topic.name)
    if info is None:
        _fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
    current = len(info.partitions)
    if topic.count == current:
        _fail(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s).")
    if topic.count < current:
        _fail(ErrorCode.INVALID_PARTITIONS, f"The topic {topic.name} currently has {current} partition(s); "
                                            f"{topic.count} would not be an increase.")
    additional = topic.count - current
    if topic.assignments is not None and len(topic.assignments) != additional:
        _fail(ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"Attempted to add {additional} additional partition(s), but "
                                                    f"only {len(topic.assignments)} assignment(s) were specified.")
    replication_factor = len(info.partitions[min(info.partitions)].replicas)
    if topic.assignments is not None:
        assignment = {}
        for i, a in enumerate(topic.assignments):
            check_manual_assignment(broker, list(a.broker_ids), replication_factor)
            assignment[current + i] = list(a.broker_ids)
    else:
        assignment = place_replicas(broker, additional, replication_factor, first_partition=current)
    if not validate_only:
        broker.add_partitions(topic.name, assignment)


async def handle_create_partitions(ctx, request: cp.CreatePartitionsRequest) -> cp.CreatePartitionsResponse:
    counts = Counter(t.name for t in request.topics)
    reported: set[str] = set()
    results = []
    for topic in request.topics:
        if topic.name in reported:
            continue
        reported.add(topic.name)
        try:
            if counts[topic.name] > 1:
                _fail(ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
            _add_partitions(ctx.broker, topic, request.validate_only)
            results.append(cp.CreatePartitionsTopicResult(name=topic.name, error_code=ErrorCode.NONE,
                                                          error_message=None))
        except KafkaApiError as e:
            # Kafka's UnknownTopicOrPartitionException there carries no message.
            message = None if e.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION else e.detail
            results.append(cp.CreatePartitionsTopicResult(name=topic.name, error_code=e.code, error_message=message))
    return cp.CreatePartitionsResponse(throttle_time_ms=0, results=results)


# ------------------------------------------------------------------------------------------ DescribeTopicPartitions
def _partition_page(broker, info, start: int, limit: int) -> tuple[list, int]:
    """Partitions [start, start + limit) of a topic and the next index (-1 when the topic is done)."""
    live = broker.live_broker_ids()
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


async def handle_describe_topic_partitions(ctx, request: dtp.DescribeTopicPartitionsRequest):
    """Kafka's DescribeTopicPartitionsRequestHandler: topics in name order from the cursor on, at most
    min(response_partition_limit, max.request.partition.size.limit) partitions (at least 1); the
    cursor of the response points at the first partition not returned."""
    broker = ctx.broker
    cursor = request.cursor
    cursor_topic = cursor.topic_name if cursor is not None else ""
    fetch_all = not request.topics
    if fetch_all:
        names = [n for n in broker.topics.names() if n >= cursor_topic]
    else:
        names = sorted({t.name for t in request.topics if t.name >= cursor_topic})
        if cursor is not None and cursor.topic_name not in names:
            return _invalid(request, "DescribeTopicPartitionsRequest topic list should contain the cursor topic: "
                                     f"{cursor.topic_name}")
    if cursor is not None and cursor.partition_index < 0:
        return _invalid(request, "DescribeTopicPartitionsRequest cursor partition must be valid")
    remaining = max(min(broker.config.get("max.request.partition.size.limit"), request.response_partition_limit), 1)
    topics, next_cursor = [], None
    for name in sorted(names):
        if remaining == 0:
            next_cursor = dtp.Cursor(topic_name=name, partition_index=0)
            break
        info = broker.topics.get(name)
        if info is None:
            if not fetch_all:
                reason = validate_topic_name(name)
                topics.append(_error_topic(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if reason is None
                                           else ErrorCode.INVALID_TOPIC_EXCEPTION))
            continue
        start = cursor.partition_index if cursor is not None and name == cursor_topic else 0
        partitions, next_index = _partition_page(broker, info, start, remaining)
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


def _invalid(request, message: str) -> dtp.DescribeTopicPartitionsResponse:
    # Kafka answers a request-level error on every requested topic; the response has no message field.
    log.info("DescribeTopicPartitions: %s", message)
    return dtp.DescribeTopicPartitionsResponse(
        throttle_time_ms=0, topics=[dtp.DescribeTopicPartitionsResponseTopic(
            error_code=ErrorCode.INVALID_REQUEST, name=t.name, topic_id=ZERO_UUID, is_internal=False, partitions=[])
            for t in request.topics])
