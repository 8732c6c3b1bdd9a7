"""The controller's requests to brokers: LeaderAndIsr (key 4), StopReplica (5), UpdateMetadata (6) and
ControlledShutdown (7) (seed 003, "LeaderAndIsr API", "StopReplica API", "UpdateMetadata API",
"ControlledShutdown API"; Kafka's ZooKeeper-era KafkaApis).

They are served by a broker in a cluster (`zk_cluster.ZkCluster`). A broker that is its own controller
(embedded mode) has no other controller to hear from: it answers STALE_CONTROLLER_EPOCH to the first
three and NOT_CONTROLLER to ControlledShutdown, and changes nothing.
"""

from __future__ import annotations

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import controlled_shutdown as csm
from odradek.protocol.messages import leader_and_isr as lm
from odradek.protocol.messages import stop_replica as sm
from odradek.protocol.messages import update_metadata as um
from odradek.server.context import RequestContext
from odradek.server.zk_cluster import ZkCluster


def _member(ctx: RequestContext) -> ZkCluster | None:
    channel = ctx.controller
    return channel if isinstance(channel, ZkCluster) else None


async def handle_leader_and_isr(ctx: RequestContext, request: lm.LeaderAndIsrRequest) -> lm.LeaderAndIsrResponse:
    member = _member(ctx)
    if member is None:
        return lm.LeaderAndIsrResponse(error_code=ErrorCode.STALE_CONTROLLER_EPOCH, partition_errors=[], topics=[])
    errors = await member.leader_and_isr(request)
    if ctx.api_version >= 5:
        ids = {ts.topic_name: ts.topic_id for ts in request.topic_states}
        by_topic: dict[str, list[lm.LeaderAndIsrPartitionError]] = {}
        for (t, p), code in errors.items():
            by_topic.setdefault(t, []).append(lm.LeaderAndIsrPartitionError(partition_index=p, error_code=code))
        return lm.LeaderAndIsrResponse(error_code=ErrorCode.NONE, topics=[
            lm.LeaderAndIsrTopicError(topic_id=ids.get(t), partition_errors=es) for t, es in by_topic.items()])
    return lm.LeaderAndIsrResponse(error_code=ErrorCode.NONE, partition_errors=[
        lm.LeaderAndIsrPartitionError(topic_name=t, partition_index=p, error_code=code)
        for (t, p), code in errors.items()])


async def handle_update_metadata(ctx: RequestContext, request: um.UpdateMetadataRequest) -> um.UpdateMetadataResponse:
    member = _member(ctx)
    if member is None:
        return um.UpdateMetadataResponse(error_code=ErrorCode.STALE_CONTROLLER_EPOCH)
    return um.UpdateMetadataResponse(error_code=await member.update_metadata(request))


async def handle_stop_replica(ctx: RequestContext, request: sm.StopReplicaRequest) -> sm.StopReplicaResponse:
    member = _member(ctx)
    if member is None:
        return sm.StopReplicaResponse(error_code=ErrorCode.STALE_CONTROLLER_EPOCH, partition_errors=[])
    errors = await member.stop_replica(request)
    return sm.StopReplicaResponse(error_code=ErrorCode.NONE, partition_errors=[
        sm.StopReplicaPartitionError(topic_name=t, partition_index=p, error_code=code)
        for (t, p), code in errors.items()])


async def handle_controlled_shutdown(ctx: RequestContext,
                                     request: csm.ControlledShutdownRequest) -> csm.ControlledShutdownResponse:
    member = _member(ctx)
    if member is None:
        return csm.ControlledShutdownResponse(error_code=ErrorCode.NOT_CONTROLLER, remaining_partitions=[])
    code, remaining = await member.controlled_shutdown_of(request.broker_id)
    return csm.ControlledShutdownResponse(error_code=code, remaining_partitions=[
        csm.RemainingPartition(topic_name=t, partition_index=p) for t, p in remaining])
