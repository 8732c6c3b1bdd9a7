"""Group APIs: FindCoordinator (10), JoinGroup (11), Heartbeat (12), LeaveGroup (13), SyncGroup (14),
DescribeGroups (15), ListGroups (16), DeleteGroups (42) (seed 000; seed 001, the server-side
coordinator; seed 004, "Group Membership API"; DESIGN, "How data flows: Groups and transactions").

Each handler asks the group coordinator runtime (`ctx.coordinators`, see `server/coordinators.py`)
to run a pure operation and encodes what it returns at the request's version. A group whose
`__consumer_offsets` partition this broker does not lead gets NOT_COORDINATOR; one still loading gets
COORDINATOR_LOAD_IN_PROGRESS. JoinGroup, SyncGroup, Heartbeat and LeaveGroup to a consumer group are
answered for its classic members (`coordinator.consumer_classic`, online migration). FindCoordinator
creates `__consumer_offsets` on its first call for a group, and answers with the coordinator's
endpoint on the listener the request came on.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from odradek.coordinator import admin, consumer_admin, consumer_classic
from odradek.coordinator.consumer_group import TopicsView
from odradek.coordinator.consumer_records import TopicMeta
from odradek.coordinator.membership import Caller
from odradek.coordinator.runtime import CoordinatorError, GroupCoordinator
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import delete_groups as dg
from odradek.protocol.messages import describe_groups as dsc
from odradek.protocol.messages import find_coordinator as fc
from odradek.protocol.messages import heartbeat as hb
from odradek.protocol.messages import join_group as jg
from odradek.protocol.messages import leave_group as lg
from odradek.protocol.messages import list_groups as ls
from odradek.protocol.messages import sync_group as sg
from odradek.server.context import RequestContext
from odradek.server.metadata_cache import BrokerEndpoint, MetadataImage

log = logging.getLogger("odradek.groups")

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1


def coordinator_of(ctx: RequestContext) -> GroupCoordinator:
    return ctx.coordinators.group_coordinator()


def caller_of(ctx: RequestContext) -> Caller:
    host = ctx.connection.peer[0] if ctx.connection is not None else "?"
    return Caller(ctx.header.client_id or "", f"/{host}", ctx.api_version)


_last_view: tuple[MetadataImage, TopicsView] | None = None


def topics_view(image: MetadataImage) -> TopicsView:
    """The image's topics for the coordinator; the same object for the same image."""
    global _last_view
    cached = _last_view
    if cached is not None and cached[0] is image:
        return cached[1]
    view = TopicsView({name: TopicMeta(info.topic_id, len(info.partitions)) for name, info in image.topics.items()},
                      frozenset(name for name, info in image.topics.items() if info.is_internal),
                      _replica_racks(image))
    _last_view = (image, view)
    return view


def _replica_racks(image: MetadataImage) -> dict[str, tuple[frozenset[str], ...]]:
    """Each partition's replica racks (`broker.rack` of the live replica brokers), for rack-aware
    assignment; empty when no broker has a rack."""
    rack_of = {b: r for b, r in image.live_broker_racks().items() if r}
    if not rack_of:
        return {}
    return {name: tuple(frozenset(rack_of[b] for b in info.partitions[p].replicas if b in rack_of)
                        if p in info.partitions else frozenset() for p in range(len(info.partitions)))
            for name, info in image.topics.items() if not info.is_internal}


async def run(ctx: RequestContext, group_id: str, op: Callable[..., Any], *args: Any) -> Any:
    return await coordinator_of(ctx).execute(group_id, op, *args)


# ------------------------------------------------------------------------------------ FindCoordinator
def _find_one(ctx: RequestContext, key: str, key_type: int) -> tuple[ErrorCode, int, BrokerEndpoint | None]:
    """(error, node id, its endpoint on the request's listener)."""
    if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
        return ErrorCode.INVALID_REQUEST, -1, None
    node_id: int | None = ctx.broker_id
    if key_type == GROUP_KEY_TYPE:
        node_id = ctx.coordinators.group_coordinator_id(key)
    else:
        node_id = ctx.coordinators.transactions.coordinator_id(key)
    if node_id is None:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, None
    for b, endpoint in ctx.metadata.image.alive_endpoints(ctx.listener_name):
        if b.broker_id == node_id:
            return ErrorCode.NONE, node_id, endpoint
    return ErrorCode.COORDINATOR_NOT_AVAILABLE, -1, None


def _message(code: ErrorCode) -> str:
    return "NONE" if code == ErrorCode.NONE else code.message   # as Kafka fills error_message


async def handle_find_coordinator(ctx: RequestContext, request: fc.FindCoordinatorRequest) -> fc.FindCoordinatorResponse:
    if ctx.api_version >= 4:
        out = []
        for key in request.coordinator_keys:
            code, node_id, e = _find_one(ctx, key, request.key_type)
            out.append(fc.Coordinator(key=key, node_id=node_id, host=e.host if e else "", port=e.port if e else -1,
                                      error_code=code, error_message=_message(code)))
        return fc.FindCoordinatorResponse(throttle_time_ms=0, coordinators=out)
    code, node_id, e = _find_one(ctx, request.key, request.key_type)
    return fc.FindCoordinatorResponse(
        throttle_time_ms=0, error_code=code, error_message=_message(code), node_id=node_id,
        host=e.host if e else "", port=e.port if e else -1)


# ------------------------------------------------------------------------------------ membership
async def handle_join_group(ctx: RequestContext, request: jg.JoinGroupRequest) -> jg.JoinGroupResponse:
    try:
        response = await run(ctx, request.group_id, consumer_classic.join_group, request, caller_of(ctx),
                             topics_view(ctx.metadata.image))
    except CoordinatorError as e:
        response = jg.JoinGroupResponse(error_code=e.code, generation_id=-1, protocol_name=None, leader="",
                                        member_id="", members=[])
    if ctx.api_version < 7 and response.protocol_name is None:
        response.protocol_name = ""   # not nullable before v7
    return response


async def handle_sync_group(ctx: RequestContext, request: sg.SyncGroupRequest) -> sg.SyncGroupResponse:
    try:
        return await run(ctx, request.group_id, consumer_classic.sync_group, request, caller_of(ctx),
                         topics_view(ctx.metadata.image))
    except CoordinatorError as e:
        return sg.SyncGroupResponse(error_code=e.code)


async def handle_heartbeat(ctx: RequestContext, request: hb.HeartbeatRequest) -> hb.HeartbeatResponse:
    try:
        return await run(ctx, request.group_id, consumer_classic.heartbeat, request, caller_of(ctx))
    except CoordinatorError as e:
        return hb.HeartbeatResponse(error_code=e.code)


async def handle_leave_group(ctx: RequestContext, request: lg.LeaveGroupRequest) -> lg.LeaveGroupResponse:
    try:
        return await run(ctx, request.group_id, consumer_classic.leave_group, request, caller_of(ctx))
    except CoordinatorError as e:
        return lg.LeaveGroupResponse(error_code=e.code)


# ------------------------------------------------------------------------------------ administration
async def handle_list_groups(ctx: RequestContext, request: ls.ListGroupsRequest) -> ls.ListGroupsResponse:
    try:
        coordinator = coordinator_of(ctx)
    except CoordinatorError as e:
        return ls.ListGroupsResponse(error_code=e.code, groups=[])
    states = {s.lower() for s in request.states_filter} if ctx.api_version >= 4 else set()
    types = {t.lower() for t in request.types_filter} if ctx.api_version >= 5 else set()
    groups = [g for shard in coordinator.shards() for g in admin.list_groups(shard, states, types)
              + consumer_admin.list_groups(shard, states, types)]
    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if coordinator.loading else ErrorCode.NONE
    return ls.ListGroupsResponse(throttle_time_ms=0, error_code=code, groups=groups)


async def handle_describe_groups(ctx: RequestContext, request: dsc.DescribeGroupsRequest) -> dsc.DescribeGroupsResponse:
    out = []
    include_ops = ctx.api_version >= 3 and request.include_authorized_operations
    for group_id in request.groups:
        try:
            described = coordinator_of(ctx).query(group_id, consumer_admin.describe_classic, group_id, include_ops)
        except CoordinatorError as e:
            described = dsc.DescribedGroup(error_code=e.code, error_message=e.code.message, group_id=group_id,
                                           group_state="", protocol_type="", protocol_data="", members=[])
        if ctx.api_version >= 6 and described.error_code == ErrorCode.NONE \
                and described.group_state == "Dead":
            described.error_code = ErrorCode.GROUP_ID_NOT_FOUND   # KIP-1043
            described.error_message = f"Group {group_id} not found."
        out.append(described)
    return dsc.DescribeGroupsResponse(throttle_time_ms=0, groups=out)


async def handle_delete_groups(ctx: RequestContext, request: dg.DeleteGroupsRequest) -> dg.DeleteGroupsResponse:
    results = []
    for group_id in request.groups_names:
        try:
            code = await run(ctx, group_id, consumer_admin.delete_group, group_id)
        except CoordinatorError as e:
            code = e.code
        results.append(dg.DeletableGroupResult(group_id=group_id, error_code=code))
    return dg.DeleteGroupsResponse(throttle_time_ms=0, results=results)
