"""Group APIs: FindCoordinator (10), JoinGroup (11), Heartbeat (12), LeaveGroup (13), SyncGroup (14),
DescribeGroups (15), ListGroups (16), DeleteGroups (42); and the broker's side of the group
coordinator: `__consumer_offsets` creation and the partition log port (seed 000; seed 001, the
server-side coordinator; seed 004, "Group Membership API"; DESIGN, "How data flows: Groups and
transactions").

Each handler asks `odradek.coordinator.runtime.GroupCoordinator` to run a pure operation and encodes
what it returns at the request's version. A group whose `__consumer_offsets` partition this broker
does not lead gets NOT_COORDINATOR; one still loading gets COORDINATOR_LOAD_IN_PROGRESS.

`__consumer_offsets` is created on the first FindCoordinator for a group, with
offsets.topic.num.partitions partitions, cleanup.policy=compact, offsets.topic.segment.bytes, and
offsets.topic.replication.factor capped at the live brokers.
"""

from __future__ import annotations

import logging

from odradek.coordinator import admin, membership
from odradek.coordinator.membership import Caller
from odradek.coordinator.records import OFFSETS_TOPIC, partition_for
from odradek.coordinator.runtime import CoordinatorError, GroupCoordinator
from odradek.coordinator.shard import GroupConfig
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import delete_groups as dg
from odradek.protocol.messages import describe_groups as dsc
from odradek.protocol.messages import find_coordinator as fc
from odradek.protocol.messages import heartbeat as hb
from odradek.protocol.messages import join_group as jg
from odradek.protocol.messages import leave_group as lg
from odradek.protocol.messages import list_groups as ls
from odradek.protocol.messages import sync_group as sg
from odradek.server.apis.produce import topic_rules
from odradek.server.log_validator import LOG_APPEND_TIME, validate

log = logging.getLogger("odradek.groups")

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1


# ------------------------------------------------------------------------------------ the broker's side
class PartitionLog:
    """`CoordinatorLog` over a broker partition: appends go through the same validation and leader
    append as a produce; reads stop at the high watermark."""

    def __init__(self, broker, partition) -> None:
        self.broker = broker
        self.partition = partition

    @property
    def log_start_offset(self) -> int:
        return self.partition.log_start_offset

    @property
    def high_watermark(self) -> int:
        return self.partition.high_watermark

    def append(self, batch: bytes, now_ms: int) -> None:
        rules = topic_rules(self.broker, OFFSETS_TOPIC)
        validated = validate(bytearray(batch), rules, now_ms)
        self.partition.append(validated, now_ms, rules.timestamp_type == LOG_APPEND_TIME)
        self.broker.purgatory.notify(self.partition.key)

    def read(self, start_offset: int, max_bytes: int) -> bytes:
        return self.partition.log.read_bytes(start_offset, max_bytes, max_offset=self.partition.high_watermark)


def group_config(config) -> GroupConfig:
    return GroupConfig(
        min_session_timeout_ms=config.get("group.min.session.timeout.ms"),
        max_session_timeout_ms=config.get("group.max.session.timeout.ms"),
        initial_rebalance_delay_ms=config.get("group.initial.rebalance.delay.ms"),
        max_size=config.get("group.max.size"),
        offset_metadata_max_bytes=config.get("offset.metadata.max.bytes"),
        offsets_retention_ms=config.get("offsets.retention.minutes") * 60_000,
        offsets_retention_check_interval_ms=config.get("offsets.retention.check.interval.ms"),
        load_buffer_bytes=config.get("offsets.load.buffer.size"))


async def start_group_coordinator(broker) -> GroupCoordinator:
    """Called by the broker once its partitions are open: loads the offsets partitions it leads."""
    coordinator = GroupCoordinator(group_config(broker.config), broker.clock)
    await coordinator.start()
    broker.group_coordinator = coordinator
    info = broker.topics.get(OFFSETS_TOPIC)
    if info is not None:
        elect_led_partitions(broker, info)
    return coordinator


def elect_led_partitions(broker, info) -> None:
    coordinator = broker.group_coordinator
    for p, state in sorted(info.partitions.items()):
        part = broker.partition(OFFSETS_TOPIC, p)
        if state.leader == broker.broker_id and part is not None and not coordinator.owns(p):
            coordinator.elect(p, PartitionLog(broker, part), len(info.partitions))


def ensure_offsets_topic(broker):
    """The offsets topic's info, creating the topic on first need; None if it cannot be created."""
    info = broker.topics.get(OFFSETS_TOPIC)
    if info is None:
        config = broker.config
        replication = min(config.get("offsets.topic.replication.factor"), len(broker.live_broker_ids()))
        info, error, message = broker.create_topic(
            OFFSETS_TOPIC, config.get("offsets.topic.num.partitions"), replication,
            {"cleanup.policy": "compact", "compression.type": "producer",
             "segment.bytes": str(config.get("offsets.topic.segment.bytes"))})
        if info is None:
            info = broker.topics.get(OFFSETS_TOPIC)
            if info is None:
                log.error("cannot create %s: %s %s", OFFSETS_TOPIC, error.name, message or "")
                return None
    elect_led_partitions(broker, info)
    return info


def coordinator_of(ctx) -> GroupCoordinator:
    coordinator = getattr(ctx.broker, "group_coordinator", None)
    if coordinator is None:
        raise CoordinatorError(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    return coordinator


def caller_of(ctx) -> Caller:
    host = ctx.connection.peer[0] if ctx.connection is not None else "?"
    return Caller(ctx.header.client_id or "", f"/{host}", ctx.api_version)


async def run(ctx, group_id: str, op, *args):
    return await coordinator_of(ctx).execute(group_id, op, *args)


# ------------------------------------------------------------------------------------ FindCoordinator
def _find_one(ctx, key: str, key_type: int) -> tuple[ErrorCode, object]:
    broker = ctx.broker
    if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
        return ErrorCode.INVALID_REQUEST, None
    node_id = broker.broker_id
    if key_type == GROUP_KEY_TYPE:
        info = ensure_offsets_topic(broker)
        if info is None:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, None
        node_id = info.partitions[partition_for(key, len(info.partitions))].leader
    for node in broker.broker_metadata(ctx.connection):
        if node.node_id == node_id and node_id in broker.live_broker_ids():
            return ErrorCode.NONE, node
    return ErrorCode.COORDINATOR_NOT_AVAILABLE, None


def _message(code: ErrorCode) -> str:
    return "NONE" if code == ErrorCode.NONE else code.message   # as Kafka fills error_message


async def handle_find_coordinator(ctx, request: fc.FindCoordinatorRequest) -> fc.FindCoordinatorResponse:
    if ctx.api_version >= 4:
        out = []
        for key in request.coordinator_keys:
            code, node = _find_one(ctx, key, request.key_type)
            out.append(fc.Coordinator(key=key, node_id=node.node_id if node else -1, host=node.host if node else "",
                                      port=node.port if node else -1, error_code=code, error_message=_message(code)))
        return fc.FindCoordinatorResponse(throttle_time_ms=0, coordinators=out)
    code, node = _find_one(ctx, request.key, request.key_type)
    return fc.FindCoordinatorResponse(
        throttle_time_ms=0, error_code=code, error_message=_message(code), node_id=node.node_id if node else -1,
        host=node.host if node else "", port=node.port if node else -1)


# ------------------------------------------------------------------------------------ membership
async def handle_join_group(ctx, request: jg.JoinGroupRequest) -> jg.JoinGroupResponse:
    try:
        response = await run(ctx, request.group_id, membership.join_group, request, caller_of(ctx))
    except CoordinatorError as e:
        response = jg.JoinGroupResponse(error_code=e.code, generation_id=-1, protocol_name=None, leader="",
                                        member_id="", members=[])
    if ctx.api_version < 7 and response.protocol_name is None:
        response.protocol_name = ""   # not nullable before v7
    return response


async def handle_sync_group(ctx, request: sg.SyncGroupRequest) -> sg.SyncGroupResponse:
    try:
        return await run(ctx, request.group_id, membership.sync_group, request, caller_of(ctx))
    except CoordinatorError as e:
        return sg.SyncGroupResponse(error_code=e.code)


async def handle_heartbeat(ctx, request: hb.HeartbeatRequest) -> hb.HeartbeatResponse:
    try:
        return await run(ctx, request.group_id, membership.heartbeat, request, caller_of(ctx))
    except CoordinatorError as e:
        return hb.HeartbeatResponse(error_code=e.code)


async def handle_leave_group(ctx, request: lg.LeaveGroupRequest) -> lg.LeaveGroupResponse:
    try:
        return await run(ctx, request.group_id, membership.leave_group, request, caller_of(ctx))
    except CoordinatorError as e:
        return lg.LeaveGroupResponse(error_code=e.code)


# ------------------------------------------------------------------------------------ administration
async def handle_list_groups(ctx, request: ls.ListGroupsRequest) -> ls.ListGroupsResponse:
    try:
        coordinator = coordinator_of(ctx)
    except CoordinatorError as e:
        return ls.ListGroupsResponse(error_code=e.code, groups=[])
    states = {s.lower() for s in request.states_filter} if ctx.api_version >= 4 else set()
    types = {t.lower() for t in request.types_filter} if ctx.api_version >= 5 else set()
    groups = [g for shard in coordinator.shards() for g in admin.list_groups(shard, states, types)]
    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if coordinator.loading else ErrorCode.NONE
    return ls.ListGroupsResponse(throttle_time_ms=0, error_code=code, groups=groups)


async def handle_describe_groups(ctx, request: dsc.DescribeGroupsRequest) -> dsc.DescribeGroupsResponse:
    out = []
    include_ops = ctx.api_version >= 3 and request.include_authorized_operations
    for group_id in request.groups:
        try:
            described = coordinator_of(ctx).query(group_id, admin.describe_group, group_id, include_ops)
        except CoordinatorError as e:
            described = dsc.DescribedGroup(error_code=e.code, error_message=e.code.message, group_id=group_id,
                                           group_state="", protocol_type="", protocol_data="", members=[])
        if ctx.api_version >= 6 and described.error_code == ErrorCode.NONE \
                and described.group_state == "Dead":
            described.error_code = ErrorCode.GROUP_ID_NOT_FOUND   # KIP-1043
            described.error_message = f"Group {group_id} not found."
        out.append(described)
    return dsc.DescribeGroupsResponse(throttle_time_ms=0, groups=out)


async def handle_delete_groups(ctx, request: dg.DeleteGroupsRequest) -> dg.DeleteGroupsResponse:
    results = []
    for group_id in request.groups_names:
        try:
            code = await run(ctx, group_id, admin.delete_group, group_id)
        except CoordinatorError as e:
            code = e.code
        results.append(dg.DeletableGroupResult(group_id=group_id, error_code=code))
    return dg.DeleteGroupsResponse(throttle_time_ms=0, results=results)
