"""Consumer group protocol APIs: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69) (seed 002,
KIP-848, as released in Kafka 4.0: heartbeat v0-v1, describe v0-v1).

The coordinator works on a `TopicsView` of the metadata image (names, topic ids, partition counts,
which topics are internal, partition racks): built once per image, and it caches what each regex
matches. The regexes the heartbeat will resolve are matched ahead, in slices of bounded work with a
turn of the event loop between them (`consumer_regex.resolve_steps`), so the heartbeat only reads the
cache. Coordinator errors (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE)
are answered as top-level error codes.
"""

from __future__ import annotations

import asyncio

from odradek.coordinator import consumer_admin, consumer_heartbeat, consumer_regex
from odradek.coordinator.consumer_group import TopicsView
from odradek.coordinator.runtime import CoordinatorError
from odradek.protocol.messages import consumer_group_describe as cgd
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from odradek.server.apis.groups import caller_of, coordinator_of, run, topics_view
from odradek.server.context import RequestContext

def _assignors(ctx: RequestContext) -> tuple[str, ...]:
    return coordinator_of(ctx).config.consumer_assignors


async def handle_consumer_group_heartbeat(ctx: RequestContext, request: cgh.ConsumerGroupHeartbeatRequest
                                          ) -> cgh.ConsumerGroupHeartbeatResponse:
    view = topics_view(ctx.metadata.image)
    try:
        await _resolve_ahead(ctx, request, view)
        return await run(ctx, request.group_id, consumer_heartbeat.heartbeat, request, caller_of(ctx), view)
    except CoordinatorError as e:
        return consumer_heartbeat.error_response(e.code)


async def _resolve_ahead(ctx: RequestContext, request: cgh.ConsumerGroupHeartbeatRequest, view: TopicsView) -> None:
    coordinator = coordinator_of(ctx)
    regexes = coordinator.query(request.group_id, consumer_regex.pending, request.group_id,
                                request.subscribed_topic_regex, view, coordinator.clock())
    for _ in consumer_regex.resolve_steps(view, regexes):
        await asyncio.sleep(0)


async def handle_consumer_group_describe(ctx: RequestContext, request: cgd.ConsumerGroupDescribeRequest
                                         ) -> cgd.ConsumerGroupDescribeResponse:
    view = topics_view(ctx.metadata.image)
    out = []
    for group_id in request.group_ids:
        try:
            described = coordinator_of(ctx).query(group_id, consumer_admin.describe, group_id,
                                                  request.include_authorized_operations, view, _assignors(ctx))
        except CoordinatorError as e:
            described = cgd.DescribedGroup(error_code=e.code, error_message=e.code.message, group_id=group_id)
        out.append(described)
    return cgd.ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=out)
