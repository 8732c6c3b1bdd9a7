"""Transaction administration: DescribeProducers (61), DescribeTransactions (65), ListTransactions
(66) (KIP-664, what `kafka-transactions.sh` uses to find and abort hanging transactions; not in
seed 003).

- DescribeProducers reads the producer state of partitions this broker leads: each producer's id,
  epoch, last sequence, last timestamp, coordinator epoch and the first offset of its open
  transaction (-1 if none). A partition led elsewhere is NOT_LEADER_OR_FOLLOWER, one that does not
  exist UNKNOWN_TOPIC_OR_PARTITION.
- DescribeTransactions describes transactional ids this broker coordinates (NOT_COORDINATOR for
  the others, TRANSACTIONAL_ID_NOT_FOUND for unknown ones).
- ListTransactions lists the transactional ids of every loaded `__transaction_state` partition,
  filtered by state names (unknown names are returned in `unknown_state_filters`), producer ids,
  v1's duration (open at least that long) and v2's id pattern (a regular expression, as Kafka's
  RE2J `matches`: the whole id); COORDINATOR_LOAD_IN_PROGRESS while a partition is loading.
"""

from __future__ import annotations


from odradek.coordinator import topic_regex
from odradek.coordinator.runtime import CoordinatorError
from odradek.coordinator.transactions import TxnMetadata, TxnShard, TxnState
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import describe_producers as dp
from odradek.protocol.messages import describe_transactions as dt
from odradek.protocol.messages import list_transactions as lt
from odradek.server.context import RequestContext

STATE_NAMES = {s.display: s for s in TxnState}


async def handle_describe_producers(ctx: RequestContext, request: dp.DescribeProducersRequest
                                    ) -> dp.DescribeProducersResponse:
    topics = []
    for t in request.topics:
        parts = []
        for index in t.partition_indexes:
            try:
                part = ctx.replica_manager.leader_partition(t.name, index)
            except KafkaApiError as e:
                parts.append(dp.PartitionResponse(partition_index=index, error_code=e.code, error_message=None,
                                                  active_producers=[]))
                continue
            state = getattr(part.log, "producer_state", None)
            producers = [] if state is None else [
                dp.ProducerState(producer_id=e.producer_id, producer_epoch=e.producer_epoch, last_sequence=e.last_seq,
                                 last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
                                 current_txn_start_offset=e.current_txn_first_offset)
                for e in sorted(state.producers.values(), key=lambda e: e.producer_id)]
            parts.append(dp.PartitionResponse(partition_index=index, error_code=ErrorCode.NONE, error_message=None,
                                              active_producers=producers))
        topics.append(dp.TopicResponse(name=t.name, partitions=parts))
    return dp.DescribeProducersResponse(throttle_time_ms=0, topics=topics)


def _describe(shard: TxnShard, transactional_id: str) -> TxnMetadata | None:
    return shard.get(transactional_id)


async def handle_describe_transactions(ctx: RequestContext, request: dt.DescribeTransactionsRequest
                                       ) -> dt.DescribeTransactionsResponse:
    out = []
    for txn_id in request.transactional_ids:
        try:
            m = ctx.coordinators.transactions.txn_coordinator().query(txn_id, _describe, txn_id)
            code = ErrorCode.NONE if m is not None else ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        except CoordinatorError as e:
            m, code = None, e.code
        if m is None:
            out.append(dt.TransactionState(error_code=code, transactional_id=txn_id, transaction_state="",
                                           transaction_timeout_ms=0, transaction_start_time_ms=-1, producer_id=-1,
                                           producer_epoch=-1, topics=[]))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, p in sorted(m.partitions):
            by_topic.setdefault(topic, []).append(p)
        out.append(dt.TransactionState(
            error_code=ErrorCode.NONE, transactional_id=txn_id, transaction_state=m.state.display,
            transaction_timeout_ms=m.timeout_ms, transaction_start_time_ms=m.start_ms, producer_id=m.producer_id,
            producer_epoch=m.producer_epoch,
            topics=[dt.TopicData(topic=t, partitions=ps) for t, ps in by_topic.items()]))
    return dt.DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=out)


async def handle_list_transactions(ctx: RequestContext, request: lt.ListTransactionsRequest
                                   ) -> lt.ListTransactionsResponse:
    unknown = [s for s in request.state_filters if s not in STATE_NAMES]
    states = {STATE_NAMES[s] for s in request.state_filters if s in STATE_NAMES}
    pids = set(request.producer_id_filters)
    duration = request.duration_filter if ctx.api_version >= 1 else -1
    pattern = request.transactional_id_pattern if ctx.api_version >= 2 else None
    try:       # RE2, bounded and linear in the id, as the subscription regexes (KIP-1152 uses RE2/J too)
        regex = topic_regex.compile_regex(pattern) if pattern else None
    except topic_regex.RegexError:
        return lt.ListTransactionsResponse(throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST,
                                           unknown_state_filters=unknown, transaction_states=[])
    try:
        coordinator = ctx.coordinators.transactions.txn_coordinator()
    except CoordinatorError as e:
        return lt.ListTransactionsResponse(throttle_time_ms=0, error_code=e.code, unknown_state_filters=unknown,
                                           transaction_states=[])
    now = ctx.clock()
    out = []
    for shard in coordinator.shards():
        for m in sorted(shard.txns.values(), key=lambda m: m.transactional_id):
            if (request.state_filters and m.state not in states) or (pids and m.producer_id not in pids):
                continue
            if duration >= 0 and (m.state != TxnState.ONGOING or now - m.start_ms < duration):
                continue
            if regex is not None and not regex.matches(m.transactional_id):
                continue
            out.append(lt.TransactionState(transactional_id=m.transactional_id, producer_id=m.producer_id,
                                           transaction_state=m.state.display))
    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS if coordinator.loading else ErrorCode.NONE
    return lt.ListTransactionsResponse(throttle_time_ms=0, error_code=code, unknown_state_filters=unknown,
                                       transaction_states=out)
