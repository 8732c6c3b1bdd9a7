"""DescribeCluster (key 60, KIP-700; v1 endpoint type, KIP-919; v2 fenced brokers, KIP-1073).

The brokers are those reachable on the listener the request came in on, as in Metadata. The controller
id is -1 when the controller is not among them (Kafka's AuthHelper does the same so clients never see a
node they cannot reach). Brokers are the only endpoint type served: a request for controllers gets
MISMATCHED_ENDPOINT_TYPE (INVALID_REQUEST at v0, which cannot ask), an unknown type
UNSUPPORTED_ENDPOINT_TYPE. No broker is ever fenced here, so `include_fenced_brokers` adds nobody.

Authorized operations (here and in DescribeTopicPartitions) are bit fields of ACL operation codes. With
no authorizer configured, Kafka reports every operation the resource type supports; so does odradek
until an authorizer is plugged in.
"""

from __future__ import annotations

from collections.abc import Iterable

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import describe_cluster as m
from odradek.server.context import RequestContext
from odradek.server.metadata_cache import FIRST_UPDATE_WAIT_S

# AclOperation codes (Kafka's org.apache.kafka.common.acl.AclOperation).
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12

# AclEntry.supportedOperations per resource type.
CLUSTER_OPERATIONS = (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE)
TOPIC_OPERATIONS = (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS)

ENDPOINT_UNKNOWN, ENDPOINT_BROKER, ENDPOINT_CONTROLLER = 0, 1, 2
_ENDPOINT_NAMES = {ENDPOINT_BROKER: "BROKER", ENDPOINT_CONTROLLER: "CONTROLLER"}


def operations_bit_field(operations: Iterable[int]) -> int:
    """Kafka's Utils.to32BitField: bit n set for operation code n."""
    bits = 0
    for op in operations:
        bits |= 1 << op
    return bits


def authorized_operations(ctx: RequestContext, supported: Iterable[int]) -> int:
    # No authorizer yet: everything the resource type supports (Kafka with authorizer.class.name unset).
    return operations_bit_field(supported)


async def handle_describe_cluster(ctx: RequestContext, request: m.DescribeClusterRequest) -> m.DescribeClusterResponse:
    await ctx.metadata.first_update(FIRST_UPDATE_WAIT_S)     # the cluster's brokers, not this one alone
    image = ctx.metadata.image
    v = ctx.api_version
    endpoint = request.endpoint_type if v >= 1 else ENDPOINT_BROKER
    if endpoint not in _ENDPOINT_NAMES:
        return m.DescribeClusterResponse(
            error_code=ErrorCode.INVALID_REQUEST if v == 0 else ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
            error_message=f"Unsupported endpoint type {endpoint}", cluster_id=image.cluster_id)
    if endpoint != ENDPOINT_BROKER:
        return m.DescribeClusterResponse(
            error_code=ErrorCode.INVALID_REQUEST if v == 0 else ErrorCode.MISMATCHED_ENDPOINT_TYPE,
            error_message=f"The request was sent to an endpoint of type BROKER, but we wanted an endpoint "
                          f"of type {_ENDPOINT_NAMES[endpoint]}",
            cluster_id=image.cluster_id)
    brokers = [m.DescribeClusterBroker(broker_id=b.broker_id, host=e.host, port=e.port, rack=b.rack)
               for b, e in image.alive_endpoints(ctx.listener_name)]
    ids = {b.broker_id for b in brokers}
    controller_id = image.controller_id if image.controller_id in ids else -1
    operations = -2147483648  # the schema's default: not asked for
    if request.include_cluster_authorized_operations:
        operations = authorized_operations(ctx, CLUSTER_OPERATIONS)
    return m.DescribeClusterResponse(
        throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, endpoint_type=ENDPOINT_BROKER,
        cluster_id=image.cluster_id, controller_id=controller_id, brokers=brokers,
        cluster_authorized_operations=operations)
