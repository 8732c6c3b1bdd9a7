"""InitProducerId (key 22) for idempotent producers (seed 003, "Message Delivery Semantics"; KIP-98).

Producer ids come from one counter kept in the metadata store (`/latest_producer_id_block`, as Kafka
kept blocks of ids on ZooKeeper), so ids stay unique across restarts. Transactional ids need the
transaction coordinator, which is not built yet: until it is they are refused with a non-retriable
error, so a transactional producer fails at once instead of retrying forever.
"""

from __future__ import annotations

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import init_producer_id as m


async def handle_init_producer_id(ctx, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
    if request.transactional_id is not None:
        return m.InitProducerIdResponse(throttle_time_ms=0, error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                                        producer_id=-1, producer_epoch=-1)
    # Without a transactional id every call gets a fresh id at epoch 0, as Kafka does (also when a
    # producer that hit an error asks with its old id and epoch, KIP-360).
    pid = ctx.broker.next_producer_id()
    return m.InitProducerIdResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=pid, producer_epoch=0)
