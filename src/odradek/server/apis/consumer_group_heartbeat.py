"""Consumer group protocol APIs: ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69) (seed 002,
KIP-848, as released in Kafka 4.0: heartbeat v0-v1, describe v0-v1).

The coordinator works on a `TopicsView` of the metadata image (names, topic ids, partition counts,
which topics are internal, partition racks): built once per image, and it caches what each regex
matches. On a cluster with many topics, the regexes the heartbeat will resolve are matched ahead, a
bounded number of names per event-loop step (`consumer_regex.resolve_in_steps`), so the heartbeat
only reads the cache. Coordinator errors (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
COORDINATOR_NOT_AVAILABLE) are answered as top-level error codes.
"""

from __future__ import annotations

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
    if len(view.by_name) <= consumer_regex.RESOLVE_STEP_NAMES:
        return   # matching inside the heartbeat costs no more than one step
    coordinator = coordinator_of(ctx)
    regexes = coordinator.query(request.group_id, consumer_regex.pending, request.group_id,
                                request.subscribed_topic_regex, view, coordinator.clock())
    if regexes:
        await consumer_regex.resolve_in_steps(view, regexes)


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
