"""AlterPartitionReassignments (key 45) and ListPartitionReassignments (key 46) (KIP-455; seed 003,
"Replication": moving replicas between brokers).

A cluster's controller makes them (`zk_controller.ActiveController.reassign`): the replicas become the
target plus the leaving ones, the new replicas catch up and join the ISR, then the leaving ones are
dropped and their logs deleted. Another broker answers NOT_CONTROLLER (clients send these to the
controller). A broker that is its own controller has one broker to place replicas on: a target of just
itself is accepted (nothing moves), any other broker id is INVALID_REPLICA_ASSIGNMENT, and nothing is
ever under way.
"""

from __future__ import annotations

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import alter_partition_reassignments as am
from odradek.protocol.messages import list_partition_reassignments as lm
from odradek.server.context import RequestContext
from odradek.server.zk_cluster import ZkCluster

Key = tuple[str, int]


async def handle_alter_partition_reassignments(ctx: RequestContext, request: am.AlterPartitionReassignmentsRequest
                                               ) -> am.AlterPartitionReassignmentsResponse:
    wanted: dict[Key, list[int] | None] = {}
    for t in request.topics:
        for p in t.partitions:
            wanted[(t.name, p.partition_index)] = None if p.replicas is None else list(p.replicas)
    channel = ctx.controller
    results: dict[Key, tuple[ErrorCode, str | None]]
    if isinstance(channel, ZkCluster):
        if channel.active is None:
            return am.AlterPartitionReassignmentsResponse(throttle_time_ms=0, error_code=ErrorCode.NOT_CONTROLLER,
                                                          error_message=ErrorCode.NOT_CONTROLLER.message, responses=[])
        rejected: dict[Key, tuple[ErrorCode, str | None]] = {}
        if ctx.api_version >= 1 and not request.allow_replication_factor_change:    # KIP-860
            for k, target in list(wanted.items()):
                st = ctx.metadata.image.partition(*k)
                if st is not None and target is not None and len(target) != len(st.replicas):
                    del wanted[k]
                    rejected[k] = (ErrorCode.INVALID_REPLICATION_FACTOR,
                                   "The replication factor is changed by this reassignment, which is not allowed.")
        results = {**await channel.active.reassign(wanted), **rejected}
    else:
        image = ctx.metadata.image
        results = {}
        for k, target in wanted.items():
            if not image.has_partition(*k):
                results[k] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)
            elif target is None:
                results[k] = (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, None)
            elif target != [ctx.broker_id]:
                results[k] = (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                              f"The proposed assignment names brokers that are not registered: "
                              f"{[r for r in target if r != ctx.broker_id] or target}")
            else:
                results[k] = (ErrorCode.NONE, None)
    by_topic: dict[str, list[am.ReassignablePartitionResponse]] = {}
    for (t, p), (code, message) in results.items():
        by_topic.setdefault(t, []).append(am.ReassignablePartitionResponse(
            partition_index=p, error_code=code, error_message=message))
    return am.AlterPartitionReassignmentsResponse(
        throttle_time_ms=0, allow_replication_factor_change=request.allow_replication_factor_change
        if ctx.api_version >= 1 else True, error_code=ErrorCode.NONE, error_message=None,
        responses=[am.ReassignableTopicResponse(name=t, partitions=ps) for t, ps in by_topic.items()])


async def handle_list_partition_reassignments(ctx: RequestContext, request: lm.ListPartitionReassignmentsRequest
                                              ) -> lm.ListPartitionReassignmentsResponse:
    channel = ctx.controller
    if isinstance(channel, ZkCluster) and channel.active is None:
        return lm.ListPartitionReassignmentsResponse(throttle_time_ms=0, error_code=ErrorCode.NOT_CONTROLLER,
                                                     error_message=ErrorCode.NOT_CONTROLLER.message, topics=[])
    keys = None if request.topics is None else [(t.name, p) for t in request.topics for p in t.partition_indexes]
    ongoing = channel.active.list_reassignments(keys) if isinstance(channel, ZkCluster) and channel.active else {}
    by_topic: dict[str, list[lm.OngoingPartitionReassignment]] = {}
    for (t, p), (replicas, adding, removing) in ongoing.items():
        by_topic.setdefault(t, []).append(lm.OngoingPartitionReassignment(
            partition_index=p, replicas=replicas, adding_replicas=adding, removing_replicas=removing))
    return lm.ListPartitionReassignmentsResponse(
        throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
        topics=[lm.OngoingTopicReassignment(name=t, partitions=ps) for t, ps in by_topic.items()])
