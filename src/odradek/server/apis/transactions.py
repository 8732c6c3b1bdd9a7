"""Transaction APIs: InitProducerId with a transactional id (22), AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26), WriteTxnMarkers (27), TxnOffsetCommit (28) (seed 003, "Message
Delivery Semantics" and the protocol guide's entries for these keys; KIP-98, KIP-360, KIP-447,
KIP-588; DESIGN, "How data flows: Groups and transactions").

Each handler asks the transaction coordinator runtime (`ctx.coordinators.transactions`) to run a
pure operation of `coordinator/transactions.py`; TxnOffsetCommit goes to the group coordinator,
whose offsets stay pending until the transaction's marker. An id whose `__transaction_state`
partition this broker does not lead gets NOT_COORDINATOR, one still loading
COORDINATOR_LOAD_IN_PROGRESS.

PRODUCER_FENCED (KIP-588) is answered as INVALID_PRODUCER_EPOCH to the versions that predate it:
InitProducerId below v4, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn below v2.
AddPartitionsToTxn v4+ (brokers only) carries several transactions; `verify_only` asks whether
partitions are in an open transaction (KIP-890's verification) without adding them, otherwise a
leader adds them for a client of the transaction protocol v2 (KIP-890 part 2), and the transaction
becomes one of that protocol. EndTxn v5+ is that protocol's end: the epoch is bumped and answered.
TxnOffsetCommit checks (v5+: adds) the group's offsets partition with the transaction coordinator
first, as Produce does (`odradek.server.txn_verification`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from odradek.cluster.store import StoreError
from odradek.coordinator import offsets
from odradek.coordinator.records import OFFSETS_TOPIC, partition_for
from odradek.coordinator.runtime import CoordinatorError
from odradek.coordinator.transactions import (
    NEED_PRODUCER_ID, TV_0, TV_2, EndResult, InitResult, add_partitions, end_txn, end_txn_v2, init_producer_id,
    verify_partitions,
)
from odradek.coordinator.transactions_runtime import TransactionCoordinator
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import add_offsets_to_txn as ao
from odradek.protocol.messages import add_partitions_to_txn as ap
from odradek.protocol.messages import end_txn as et
from odradek.protocol.messages import init_producer_id as ip
from odradek.protocol.messages import txn_offset_commit as toc
from odradek.protocol.messages import write_txn_markers as wtm
from odradek.server.context import RequestContext
from odradek.server.metadata_cache import MetadataImage
from odradek.server.slices import Slices
from odradek.server.txn_markers import Marker, append_markers
from odradek.server.txn_verification import offset_commit_error, txn_offset_commit_operation

log = logging.getLogger("odradek.transactions")

Partitions = list[tuple[str, int]]


def _coordinator(ctx: RequestContext) -> TransactionCoordinator:
    return ctx.coordinators.transactions.txn_coordinator()


def _fenced(code: ErrorCode, ctx: RequestContext, first_version: int) -> ErrorCode:
    """PRODUCER_FENCED for the versions that know it, INVALID_PRODUCER_EPOCH for older ones."""
    if code == ErrorCode.PRODUCER_FENCED and ctx.api_version < first_version:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


# ------------------------------------------------------------------------------------ InitProducerId
async def init_transactional_producer(ctx: RequestContext, request: ip.InitProducerIdRequest) -> ip.InitProducerIdResponse:
    def answer(result: InitResult) -> ip.InitProducerIdResponse:
        return ip.InitProducerIdResponse(throttle_time_ms=0, error_code=_fenced(result.error, ctx, 4),
                                         producer_id=result.producer_id, producer_epoch=result.producer_epoch)

    txn_id = request.transactional_id
    if not txn_id:
        return answer(InitResult(ErrorCode.INVALID_REQUEST))
    expected_pid = request.producer_id if ctx.api_version >= 3 else -1
    expected_epoch = request.producer_epoch if ctx.api_version >= 3 else -1
    new_pid: int | None = None
    for _ in range(2):
        try:
            result = await _coordinator(ctx).execute(txn_id, init_producer_id, txn_id, request.transaction_timeout_ms,
                                                     expected_pid, expected_epoch, new_pid)
        except CoordinatorError as e:
            return answer(InitResult(e.code))
        if result is not NEED_PRODUCER_ID:
            assert isinstance(result, InitResult)
            return answer(result)
        try:
            new_pid = await ctx.controller.next_producer_id()
        except StoreError as e:
            log.warning("no producer id block: %s", e)
            return answer(InitResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    return answer(InitResult(ErrorCode.CONCURRENT_TRANSACTIONS))


# ------------------------------------------------------------------------------------ AddPartitionsToTxn
# A request may name a great many partitions (200,000 in one topic is 800 KB on the wire): the named
# partitions are deduplicated and checked against the metadata image first, on the worker pool when
# there are more than INLINE_PARTITIONS_MAX of them (the image is immutable, the request the handler's
# own). If any is unknown, Kafka's answer needs no coordinator: UNKNOWN_TOPIC_OR_PARTITION for those,
# OPERATION_NOT_ATTEMPTED for the others. Otherwise every partition named exists, so the request names
# at most as many partitions as the cluster has, and goes to the coordinator.
INLINE_PARTITIONS_MAX = 4096


def _resolve(image: MetadataImage, topics: list[ap.AddPartitionsToTxnTopic]
             ) -> tuple[Partitions, list[ap.AddPartitionsToTxnTopicResult] | None]:
    """(the partitions named, deduplicated, in order; None) if they all exist, else ([], the answer)."""
    named: dict[str, dict[int, None]] = {}
    for t in topics:
        ps = named.get(t.name)
        if ps is None:
            named[t.name] = dict.fromkeys(t.partitions)
        else:
            ps.update(dict.fromkeys(t.partitions))
    unknown: dict[str, set[int]] = {}
    for name, ps in named.items():
        info = image.topic(name)
        known = info.partitions if info is not None else {}
        missing = {p for p in ps if p not in known}
        if missing:
            unknown[name] = missing
    if not unknown:
        return [(name, p) for name, ps in named.items() for p in ps], None
    Result = ap.AddPartitionsToTxnPartitionResult
    bad, skipped = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.OPERATION_NOT_ATTEMPTED
    results = []
    for name, ps in named.items():
        missing = unknown.get(name, set())
        results.append(ap.AddPartitionsToTxnTopicResult(name=name, results_by_partition=[
            Result(partition_index=p, partition_error_code=bad if p in missing else skipped) for p in ps]))
    return [], results


def _topic_results(partitions: Partitions, errors: dict[tuple[str, int], ErrorCode]
                   ) -> list[ap.AddPartitionsToTxnTopicResult]:
    by_topic: dict[str, list[ap.AddPartitionsToTxnPartitionResult]] = {}
    for tp in partitions:
        by_topic.setdefault(tp[0], []).append(
            ap.AddPartitionsToTxnPartitionResult(partition_index=tp[1], partition_error_code=errors[tp]))
    return [ap.AddPartitionsToTxnTopicResult(name=t, results_by_partition=rs) for t, rs in by_topic.items()]


async def _add(ctx: RequestContext, txn_id: str, producer_id: int, producer_epoch: int,
               topics: list[ap.AddPartitionsToTxnTopic], verify_only: bool) -> list[ap.AddPartitionsToTxnTopicResult]:
    image = ctx.metadata.image
    if sum(len(t.partitions) for t in topics) > INLINE_PARTITIONS_MAX:
        partitions, answer = await ctx.workers.run(_resolve, image, topics)
    else:
        partitions, answer = _resolve(image, topics)
    if answer is not None:
        return answer
    try:
        if verify_only:
            verified: dict[tuple[str, int], ErrorCode] = _coordinator(ctx).query(
                txn_id, verify_partitions, txn_id, producer_id, producer_epoch, partitions)
            return _topic_results(partitions, verified)
        # v4+ comes from a partition leader adding for a client of the protocol v2 (Kafka's
        # transactionVersionForAddPartitionsToTxn); below, from the client itself.
        version = TV_2 if ctx.api_version >= 4 else TV_0
        code = await _coordinator(ctx).execute(txn_id, functools.partial(add_partitions, client_transaction_version=version),
                                               txn_id, producer_id, producer_epoch, partitions)
    except CoordinatorError as e:
        code = e.code
    code = _fenced(code, ctx, 2)
    return _topic_results(partitions, {tp: code for tp in partitions})


async def handle_add_partitions_to_txn(ctx: RequestContext, request: ap.AddPartitionsToTxnRequest
                                       ) -> ap.AddPartitionsToTxnResponse:
    if ctx.api_version <= 3:
        answer = await _add(ctx, request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                            request.v3_and_below_producer_epoch, request.v3_and_below_topics, False)
        return ap.AddPartitionsToTxnResponse(throttle_time_ms=0, results_by_topic_v3_and_below=answer)
    results = []
    slices = Slices()
    for txn in request.transactions:
        await slices.pause()
        answer = await _add(ctx, txn.transactional_id, txn.producer_id, txn.producer_epoch, txn.topics,
                            txn.verify_only)
        results.append(ap.AddPartitionsToTxnResult(transactional_id=txn.transactional_id, topic_results=answer))
    return ap.AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                         results_by_transaction=results)


async def handle_add_offsets_to_txn(ctx: RequestContext, request: ao.AddOffsetsToTxnRequest
                                    ) -> ao.AddOffsetsToTxnResponse:
    info = ctx.coordinators.ensure_offsets_topic()
    if info is None:
        return ao.AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE)
    tp = (OFFSETS_TOPIC, partition_for(request.group_id, len(info.partitions)))
    try:
        code = await _coordinator(ctx).execute(request.transactional_id, add_partitions, request.transactional_id,
                                               request.producer_id, request.producer_epoch, [tp])
    except CoordinatorError as e:
        code = e.code
    return ao.AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=_fenced(code, ctx, 2))


# ------------------------------------------------------------------------------------ EndTxn
async def handle_end_txn(ctx: RequestContext, request: et.EndTxnRequest) -> et.EndTxnResponse:
    if ctx.api_version >= 5:
        return await _end_txn_v2(ctx, request)
    try:
        code = await _coordinator(ctx).execute(request.transactional_id, end_txn, request.transactional_id,
                                               request.producer_id, request.producer_epoch, request.committed)
    except CoordinatorError as e:
        code = e.code
    ok = code == ErrorCode.NONE
    return et.EndTxnResponse(throttle_time_ms=0, error_code=_fenced(code, ctx, 2),
                             producer_id=request.producer_id if ok else -1,
                             producer_epoch=request.producer_epoch if ok else -1)


async def _end_txn_v2(ctx: RequestContext, request: et.EndTxnRequest) -> et.EndTxnResponse:
    """The transaction protocol v2's EndTxn: the answer carries the next transaction's producer id
    and epoch (a new producer id when the epochs run out)."""
    txn_id = request.transactional_id
    next_pid: int | None = None
    result = EndResult(ErrorCode.CONCURRENT_TRANSACTIONS)
    for _ in range(2):
        try:
            answer = await _coordinator(ctx).execute(txn_id, end_txn_v2, txn_id, request.producer_id,
                                                     request.producer_epoch, request.committed, next_pid)
        except CoordinatorError as e:
            result = EndResult(e.code)
            break
        if answer is not NEED_PRODUCER_ID:
            assert isinstance(answer, EndResult)
            result = answer
            break
        try:
            next_pid = await ctx.controller.next_producer_id()
        except StoreError as e:
            log.warning("no producer id block: %s", e)
            result = EndResult(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            break
    return et.EndTxnResponse(throttle_time_ms=0, error_code=result.error, producer_id=result.producer_id,
                             producer_epoch=result.producer_epoch)


# ------------------------------------------------------------------------------------ TxnOffsetCommit
async def handle_txn_offset_commit(ctx: RequestContext, request: toc.TxnOffsetCommitRequest
                                   ) -> toc.TxnOffsetCommitResponse:
    image = ctx.metadata.image

    def topic_error(name: str | None) -> ErrorCode:
        return ErrorCode.NONE if name is not None and image.topic(name) is not None \
            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    code = await _verify_offsets_partition(ctx, request)
    if code == ErrorCode.NONE:
        try:
            response: toc.TxnOffsetCommitResponse = await ctx.coordinators.group_coordinator().execute(
                request.group_id, offsets.txn_commit_offsets, request, ctx.api_version, topic_error)
            return response
        except CoordinatorError as e:
            code = e.code
    return toc.TxnOffsetCommitResponse(throttle_time_ms=0, topics=[
        toc.TxnOffsetCommitResponseTopic(name=t.name, partitions=[
            toc.TxnOffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code)
            for p in t.partitions]) for t in request.topics])


async def _verify_offsets_partition(ctx: RequestContext, request: toc.TxnOffsetCommitRequest) -> ErrorCode:
    """KIP-890 for TxnOffsetCommit: the group's offsets partition must be in the transaction (v5+:
    is added to it) before offsets are written to it for the transaction."""
    operation = txn_offset_commit_operation(ctx.api_version)
    verifier = ctx.coordinators.transactions.verifier
    if not verifier.wanted(request.transactional_id, operation):
        return ErrorCode.NONE
    info = ctx.metadata.image.topic(OFFSETS_TOPIC)
    if info is None or not info.partitions:
        return ErrorCode.NONE            # the group coordinator answers it
    tp = (OFFSETS_TOPIC, partition_for(request.group_id, len(info.partitions)))
    try:
        part = ctx.replica_manager.leader_partition(*tp)
    except KafkaApiError as e:
        return offset_commit_error(e.code)
    state = getattr(part.log, "producer_state", None)
    if state is None:
        return ErrorCode.NONE
    guard = state.maybe_start_verification(request.producer_id, -1, request.producer_epoch, ctx.clock(),
                                           operation.supports_epoch_bump)
    if guard is None:
        return ErrorCode.NONE
    errors = await verifier.verify(request.transactional_id, request.producer_id, request.producer_epoch, [tp],
                                   operation)
    return offset_commit_error(errors.get(tp, ErrorCode.NONE))


# ------------------------------------------------------------------------------------ WriteTxnMarkers
async def handle_write_txn_markers(ctx: RequestContext, request: wtm.WriteTxnMarkersRequest
                                   ) -> wtm.WriteTxnMarkersResponse:
    markers = [Marker(m.producer_id, m.producer_epoch, m.transaction_result, m.coordinator_epoch,
                      [(t.name, p) for t in m.topics for p in t.partition_indexes]) for m in request.markers]
    group: Any
    try:
        group = ctx.coordinators.group_coordinator()
    except CoordinatorError:
        group = None
    results = await append_markers(ctx.replica_manager, group, markers, ctx.clock())
    out = []
    for m, errors in zip(request.markers, results):
        topics = [wtm.WritableTxnMarkerTopicResult(name=t.name, partitions=[
            wtm.WritableTxnMarkerPartitionResult(partition_index=p, error_code=errors[(t.name, p)])
            for p in t.partition_indexes]) for t in m.topics]
        out.append(wtm.WritableTxnMarkerResult(producer_id=m.producer_id, topics=topics))
    return wtm.WriteTxnMarkersResponse(markers=out)
