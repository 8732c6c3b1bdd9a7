"""ElectLeaders (key 43; the seed's "ElectPreferredLeaders API", seed 003; KIP-460 election types).

Served by the controller of a cluster (`zk_controller.ActiveController.elect_leaders`); another broker
answers NOT_CONTROLLER, as Kafka's brokers did before requests were forwarded. A broker that is its
own controller (embedded mode) has one replica per partition: every partition named answers
ELECTION_NOT_NEEDED (its leader is its preferred replica), unknown ones UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import elect_leaders as m
from odradek.server.context import RequestContext
from odradek.server.zk_cluster import ZkCluster


async def handle_elect_leaders(ctx: RequestContext, request: m.ElectLeadersRequest) -> m.ElectLeadersResponse:
    election_type = request.election_type if ctx.api_version >= 1 else 0
    keys = None if request.topic_partitions is None else \
        [(t.topic, p) for t in request.topic_partitions for p in t.partitions]
    channel = ctx.controller
    if isinstance(channel, ZkCluster):
        results = await channel.elect_leaders(election_type, keys)
        if results is None:
            return m.ElectLeadersResponse(throttle_time_ms=0, error_code=ErrorCode.NOT_CONTROLLER,
                                          replica_election_results=[])
    else:
        image = ctx.metadata.image
        wanted = keys if keys is not None else [(n, p) for n in image.topic_names() for p in image.topic(n).partitions]  # type: ignore[union-attr]
        results = {k: ErrorCode.ELECTION_NOT_NEEDED if image.has_partition(*k) else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                   for k in wanted}
    if keys is None:      # Kafka answers an election of every partition with the ones it elected
        results = {k: c for k, c in results.items() if c is ErrorCode.NONE}
    by_topic: dict[str, list[m.PartitionResult]] = {}
    for (t, p), code in results.items():
        by_topic.setdefault(t, []).append(m.PartitionResult(
            partition_id=p, error_code=code, error_message=None if code is ErrorCode.NONE else code.message))
    return m.ElectLeadersResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, replica_election_results=[
        m.ReplicaElectionResult(topic=t, partition_result=rs) for t, rs in by_topic.items()])
