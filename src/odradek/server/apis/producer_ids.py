"""InitProducerId (key 22) for idempotent producers (seed 003, "Message Delivery Semantics"; KIP-98).

Producer ids come from blocks of 1,000 claimed in the metadata store (`/latest_producer_id_block`, as
Kafka's ZooKeeper-era ProducerIdManager claimed them; `cluster/producer_ids.py`) and handed out from
memory, so ids stay unique and increasing across restarts and only one call in 1,000 writes to the
store. When no block can be claimed (a full disk) the answer is COORDINATOR_LOAD_IN_PROGRESS,
retriable, as Kafka answers while its next block is not there. A transactional id goes to the
transaction coordinator (`apis/transactions.py`).
"""

from __future__ import annotations

import logging

from odradek.cluster.store import StoreError
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import init_producer_id as m
from odradek.server.apis.transactions import init_transactional_producer
from odradek.server.context import RequestContext

log = logging.getLogger("odradek.producer_ids")


async def handle_init_producer_id(ctx: RequestContext, request: m.InitProducerIdRequest) -> m.InitProducerIdResponse:
    if request.transactional_id is not None:
        return await init_transactional_producer(ctx, request)
    # Without a transactional id every call gets a fresh id at epoch 0, as Kafka does (also when a
    # producer that hit an error asks with its old id and epoch, KIP-360).
    try:
        pid = await ctx.controller.next_producer_id()
    except StoreError as e:
        log.warning("no producer id block: %s", e)
        return m.InitProducerIdResponse(throttle_time_ms=0, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                                        producer_id=-1, producer_epoch=-1)
    return m.InitProducerIdResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, producer_id=pid, producer_epoch=0)
