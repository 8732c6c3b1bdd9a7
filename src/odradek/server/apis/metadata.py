"""Metadata (key 3): brokers, controller and the topics' partitions, leaders and ISRs
(seed 003, "Metadata API"; seed 004, "Metadata API" and "Partitioning and bootstrapping").

Topics named in the request that do not exist are created when both `auto.create.topics.enable` and the
request's allow_auto_topic_creation (v4+; always true before) say so, with `num.partitions` and
`default.replication.factor`. A null topic list (v1+) or an empty one at v0 asks for every topic.
"""

from __future__ import annotations

from odradek.cluster.topics import validate_topic_name
from odradek.server.apis.admin_cluster import CLUSTER_OPERATIONS, TOPIC_OPERATIONS, authorized_operations
from odradek.protocol.codec import ZERO_UUID
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import metadata as m


def partition_metadata(info, broker) -> list[m.MetadataResponsePartition]:
    out = []
    live = broker.live_broker_ids()
    for p in sorted(info.partitions):
        st = info.partitions[p]
        error = ErrorCode.NONE if st.leader in live else ErrorCode.LEADER_NOT_AVAILABLE
        out.append(m.MetadataResponsePartition(
            error_code=error, partition_index=p, leader_id=st.leader if st.leader in live else -1,
            leader_epoch=st.leader_epoch, replica_nodes=list(st.replicas), isr_nodes=list(st.isr),
            offline_replicas=[r for r in st.replicas if r not in live]))
    return out


UNSET_OPERATIONS = -2147483648  # "not requested" in Metadata's authorized-operations fields


def topic_metadata(info, broker, topic_operations: int = UNSET_OPERATIONS) -> m.MetadataResponseTopic:
    return m.MetadataResponseTopic(
        error_code=ErrorCode.NONE, name=info.name, topic_id=info.topic_id, is_internal=info.is_internal,
        partitions=partition_metadata(info, broker), topic_authorized_operations=topic_operations)


async def handle_metadata(ctx, request: m.MetadataRequest) -> m.MetadataResponse:
    broker = ctx.broker
    v = ctx.api_version
    topics = broker.topics
    if request.topics is None or (v == 0 and not request.topics):
        wanted = [(name, None) for name in topics.names()]
    else:
        wanted = [(t.name, t.topic_id) for t in request.topics]
    allow_create = request.allow_auto_topic_creation if v >= 4 else True
    topic_ops = UNSET_OPERATIONS
    if v >= 8 and request.include_topic_authorized_operations:
        topic_ops = authorized_operations(ctx, TOPIC_OPERATIONS)
    cluster_ops = UNSET_OPERATIONS
    if 8 <= v <= 10 and request.include_cluster_authorized_operations:
        cluster_ops = authorized_operations(ctx, CLUSTER_OPERATIONS)
    out = []
    for name, topic_id in wanted:
        if name is None:
            info = broker.topic_by_id(topic_id)
            if info is None:
                out.append(m.MetadataResponseTopic(error_code=ErrorCode.UNKNOWN_TOPIC_ID, name=None,
                                                   topic_id=topic_id))
                continue
        else:
            reason = validate_topic_name(name)
            if reason is not None:
                out.append(m.MetadataResponseTopic(error_code=ErrorCode.INVALID_TOPIC_EXCEPTION, name=name,
                                                   topic_id=ZERO_UUID))
                continue
            info = topics.get(name)
            if info is None and allow_create and broker.config.get("auto.create.topics.enable"):
                info, error = await broker.auto_create_topic(name)
                if info is None:
                    out.append(m.MetadataResponseTopic(error_code=error, name=name))
                    continue
            if info is None:
                out.append(m.MetadataResponseTopic(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, name=name))
                continue
        out.append(topic_metadata(info, broker, topic_ops))
    return m.MetadataResponse(
        throttle_time_ms=0, brokers=broker.broker_metadata(ctx.connection), cluster_id=broker.cluster_id,
        controller_id=broker.controller_id, topics=out, cluster_authorized_operations=cluster_ops)
