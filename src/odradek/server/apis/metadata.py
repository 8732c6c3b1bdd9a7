"""Metadata (key 3): brokers, controller and the topics' partitions, leaders and ISRs
(seed 003, "Metadata API"; seed 004, "Metadata API" and "Partitioning and bootstrapping").

Topics named in the request that do not exist are created when both `auto.create.topics.enable` and the
request's allow_auto_topic_creation (v4+; always true before) say so, as Kafka's AutoTopicCreationManager
creates them: `num.partitions` and `default.replication.factor`, except the internal topics, which get
their own partition counts and compacted configs (`__consumer_offsets`: offsets.topic.*,
`__transaction_state`: transaction.state.log.*; the replication factor at most the live brokers, as
FindCoordinator creates the offsets topic). `__cluster_metadata` is never created: Kafka's controller
refuses it and the Metadata response says UNKNOWN_TOPIC_OR_PARTITION. One request creates at most
10,000 partitions (Kafka's controller bound); topics past that are answered UNKNOWN_TOPIC_OR_PARTITION,
retriable, and created by a later request. All topics of a request are recorded with one store write.

A request may name a great many topics (400,000 names is legal and 6.4 MB on the wire): each is
answered, as Kafka does, UNKNOWN_TOPIC_OR_PARTITION when it does not exist and is not created. The
names are looked up in slices of the event loop, and a large answer holds one slot per name, built into
a message only as it is encoded on the worker pool (`TopicAnswers`); the dispatcher defers full garbage
collections meanwhile. Auto-creation keeps Kafka's controller bound of 10,000 partitions per request
(below), so a request naming 400,000 new names creates at most that many partitions' topics.

A null topic list (v1+) or an empty one at v0 asks for every topic. Topics come from the broker's image;
only auto-creation waits for the controller, and, on a cluster broker just started, the controller's
first UpdateMetadata (`MetadataCache.first_update`: before it, the image names this broker alone).
"""

from __future__ import annotations

from collections.abc import Sequence

from odradek.cluster.controller import MAX_PARTITIONS_PER_REQUEST
from odradek.cluster.topics import CLUSTER_METADATA_TOPIC, INTERNAL_TOPICS, TopicInfo, validate_topic_name
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import metadata as m
from odradek.server.apis.admin_cluster import CLUSTER_OPERATIONS, TOPIC_OPERATIONS, authorized_operations
from odradek.server.config import ConfigError, TopicConfig
from odradek.server.context import RequestContext
from odradek.server.internal_topics import creation_spec
from odradek.server.metadata_cache import FIRST_UPDATE_WAIT_S
from odradek.server.slices import Slices


def partition_metadata(info: TopicInfo, live: frozenset[int]) -> list[m.MetadataResponsePartition]:
    out = []
    for p in sorted(info.partitions):
        st = info.partitions[p]
        error = ErrorCode.NONE if st.leader in live else ErrorCode.LEADER_NOT_AVAILABLE
        out.append(m.MetadataResponsePartition(
            error_code=error, partition_index=p, leader_id=st.leader if st.leader in live else -1,
            leader_epoch=st.leader_epoch, replica_nodes=list(st.replicas), isr_nodes=list(st.isr),
            offline_replicas=[r for r in st.replicas if r not in live]))
    return out


UNSET_OPERATIONS = -2147483648  # "not requested" in Metadata's authorized-operations fields


def topic_metadata(info: TopicInfo, live: frozenset[int],
                   topic_operations: int = UNSET_OPERATIONS) -> m.MetadataResponseTopic:
    return m.MetadataResponseTopic(
        error_code=ErrorCode.NONE, name=info.name, topic_id=info.topic_id, is_internal=info.is_internal,
        partitions=partition_metadata(info, live), topic_authorized_operations=topic_operations)


LAZY_ANSWERS_MIN = 1024   # answers naming more topics than this are built as they are encoded


class TopicAnswers(Sequence):
    """The topics of a large Metadata answer, one per topic of the request, built as they are encoded
    (the answer is encoded on the worker pool): what is held is one slot per topic, either the
    answer already built (a topic that exists) or the error code of one that does not, so an answer
    to 400,000 unknown names costs a list of error codes instead of 400,000 messages."""

    __slots__ = ("requested", "outcomes")

    def __init__(self, requested: list[m.MetadataRequestTopic], outcomes: list) -> None:
        self.requested = requested
        self.outcomes = outcomes

    def __len__(self) -> int:
        return len(self.outcomes)

    def __getitem__(self, i: int) -> m.MetadataResponseTopic:  # type: ignore[override]
        outcome = self.outcomes[i]
        return outcome if type(outcome) is not int else error_topic(self.requested[i], outcome)


def error_topic(t: m.MetadataRequestTopic, code: int) -> m.MetadataResponseTopic:
    """The answer for a topic named (or identified) in the request that is not answered with its
    metadata: by id, as named; an unknown id is answered with the id and no name."""
    if t.name is None:
        return m.MetadataResponseTopic(error_code=code, name=None, topic_id=t.topic_id, partitions=NO_PARTITIONS)
    return m.MetadataResponseTopic(error_code=code, name=t.name, is_internal=t.name in INTERNAL_TOPICS,
                                   partitions=NO_PARTITIONS)


NO_PARTITIONS: list = []   # shared by every error answer; the encoder only reads it


async def handle_metadata(ctx: RequestContext, request: m.MetadataRequest) -> m.MetadataResponse:
    v = ctx.api_version
    await ctx.metadata.first_update(FIRST_UPDATE_WAIT_S)
    image = ctx.metadata.image
    live = image.live_broker_ids()
    topic_ops = UNSET_OPERATIONS
    if v >= 8 and request.include_topic_authorized_operations:
        topic_ops = authorized_operations(ctx, TOPIC_OPERATIONS)
    cluster_ops = UNSET_OPERATIONS
    if 8 <= v <= 10 and request.include_cluster_authorized_operations:
        cluster_ops = authorized_operations(ctx, CLUSTER_OPERATIONS)
    brokers = [m.MetadataResponseBroker(node_id=b.broker_id, host=e.host, port=e.port, rack=b.rack)
               for b, e in image.alive_endpoints(ctx.listener_name)]
    slices = Slices()
    if request.topics is None or (v == 0 and not request.topics):
        out: list = []
        for name in image.topic_names():
            info = image.topic(name)
            if info is not None:
                out.append(topic_metadata(info, live, topic_ops))
                await slices.pause()
        return m.MetadataResponse(throttle_time_ms=0, brokers=brokers, cluster_id=image.cluster_id,
                                  controller_id=image.controller_id, topics=out,
                                  cluster_authorized_operations=cluster_ops)
    # One slot per topic named: its answer, or the error code it is answered with (TopicAnswers).
    requested = request.topics
    outcomes: list = []
    to_create: dict[str, list[int]] = {}     # name -> its places in `outcomes`
    allow_create = request.allow_auto_topic_creation if v >= 4 else True
    may_create = allow_create and image.config.get("auto.create.topics.enable")
    for t in requested:
        await slices.pause()
        name = t.name
        if name is None:
            info = image.topic_by_id(t.topic_id)
            if info is None:
                outcomes.append(ErrorCode.UNKNOWN_TOPIC_ID.value)
                continue
        else:
            info = image.topic(name)
            if info is None:
                if validate_topic_name(name) is not None:
                    outcomes.append(ErrorCode.INVALID_TOPIC_EXCEPTION.value)
                    continue
                if may_create:
                    to_create.setdefault(name, []).append(len(outcomes))
                outcomes.append(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.value)
                continue
        outcomes.append(topic_metadata(info, live, topic_ops))
    if to_create and not ctx.controller.is_active:
        # A cluster's non-controller asks the controller (Kafka's auto-topic creation forwarding) and
        # answers LEADER_NOT_AVAILABLE, retriable, until the controller's UpdateMetadata brings them.
        ctx.controller.request_creation([(name, *creation_spec(name, ctx.config)) for name in to_create])
        for places in to_create.values():
            for place in places:
                outcomes[place] = ErrorCode.LEADER_NOT_AVAILABLE.value
    elif to_create:
        created = await ctx.controller.call(auto_create_topics, ctx, list(to_create))
        for name, (info, error) in created.items():
            answer = topic_metadata(info, live, topic_ops) if info is not None else int(error)
            for place in to_create[name]:
                outcomes[place] = answer
    topics: Sequence = TopicAnswers(requested, outcomes)
    if len(outcomes) <= LAZY_ANSWERS_MIN:
        topics = list(topics)
    return m.MetadataResponse(
        throttle_time_ms=0, brokers=brokers, cluster_id=image.cluster_id, controller_id=image.controller_id,
        topics=topics, cluster_authorized_operations=cluster_ops)


# ------------------------------------------------------------------------------------------ auto-creation
async def auto_create_topics(ctx: RequestContext, names: list[str]) -> dict[str, tuple[TopicInfo | None, ErrorCode]]:
    """Create the missing topics a Metadata request names, as far as the request's bound allows."""
    out: dict[str, tuple[TopicInfo | None, ErrorCode]] = {}
    channel = ctx.controller
    controller = channel.controller
    config = ctx.config
    live = ctx.metadata.image.live_broker_racks()
    async with channel.lock:
        await channel.retry_pending_deletions()
        budget = MAX_PARTITIONS_PER_REQUEST
        planned: list[TopicInfo] = []
        slices = Slices()
        try:
            for name in names:
                await slices.pause()
                existing = controller.image.get(name)
                if existing is not None:     # created while this request waited for the controller
                    out[name] = (existing, ErrorCode.NONE)
                    continue
                if name == CLUSTER_METADATA_TOPIC:
                    out[name] = (None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    continue
                partitions, factor, configs = creation_spec(name, config, len(live))
                if (partitions if partitions > 0 else channel.topic_defaults()[0]) > budget:
                    out[name] = (None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                    continue
                try:
                    TopicConfig.resolve(configs, config)
                    info = controller.plan_topic(name, partitions, factor, None, configs, live, channel.topic_defaults())
                except ConfigError:
                    out[name] = (None, ErrorCode.INVALID_CONFIG)
                    continue
                except KafkaApiError as e:
                    # A name being created right now: Kafka's answer for a creation under way.
                    out[name] = (None, ErrorCode.LEADER_NOT_AVAILABLE if e.code == ErrorCode.TOPIC_ALREADY_EXISTS
                                 else e.code)
                    continue
                budget -= len(info.partitions)
                planned.append(info)
            if planned:
                await channel.create_topics(planned)
        except KafkaApiError as e:
            for info in planned:
                out[info.name] = (None, e.code)
            planned = []
        finally:
            controller.release(info.name for info in planned)
    for info in planned:
        out[info.name] = (controller.image.get(info.name), ErrorCode.NONE)
    return out
