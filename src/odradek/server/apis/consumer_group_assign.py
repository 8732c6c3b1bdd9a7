"""ConsumerGroupPrepareAssignment (16384) and ConsumerGroupInstallAssignment (16385): seed 002's
client-side assignors, an odradek extension (`odradek.protocol.extensions`, docs/extensions.md; the
state machine is `coordinator.consumer_client_assign`).

With `group.consumer.client.assignors.enable=false` (the default) the broker neither lists these keys
in ApiVersions nor serves them: a request is answered UNSUPPORTED_VERSION (`answer_disabled`).
Coordinator errors (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE) are
answered as top-level error codes.
"""

from __future__ import annotations

from odradek.coordinator import consumer_client_assign
from odradek.coordinator.runtime import CoordinatorError
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import consumer_group_install_assignment as cgi
from odradek.protocol.messages import consumer_group_prepare_assignment as cgp
from odradek.server.apis.groups import run, topics_view
from odradek.server.context import RequestContext


async def handle_consumer_group_prepare_assignment(ctx: RequestContext,
                                                   request: cgp.ConsumerGroupPrepareAssignmentRequest
                                                   ) -> cgp.ConsumerGroupPrepareAssignmentResponse:
    try:
        return await run(ctx, request.group_id, consumer_client_assign.prepare, request,
                         topics_view(ctx.metadata.image))
    except CoordinatorError as e:
        return cgp.ConsumerGroupPrepareAssignmentResponse(error_code=e.code)


async def handle_consumer_group_install_assignment(ctx: RequestContext,
                                                   request: cgi.ConsumerGroupInstallAssignmentRequest
                                                   ) -> cgi.ConsumerGroupInstallAssignmentResponse:
    try:
        return await run(ctx, request.group_id, consumer_client_assign.install, request,
                         topics_view(ctx.metadata.image))
    except CoordinatorError as e:
        return cgi.ConsumerGroupInstallAssignmentResponse(error_code=e.code)


async def answer_disabled(ctx: RequestContext, request: object) -> object:
    """The answer to an extension API the broker's settings leave off."""
    module = type(request).__module__
    if module.endswith("prepare_assignment"):
        return cgp.ConsumerGroupPrepareAssignmentResponse(
            error_code=ErrorCode.UNSUPPORTED_VERSION,
            error_message="client-side assignors are off (group.consumer.client.assignors.enable=false)")
    return cgi.ConsumerGroupInstallAssignmentResponse(
        error_code=ErrorCode.UNSUPPORTED_VERSION,
        error_message="client-side assignors are off (group.consumer.client.assignors.enable=false)")
