"""Produce (key 0): validate each partition's record set and append it to the partition's log
(seed 003, "The Producer" and "Produce API"; DESIGN, "How data flows": Produce).

acks=0 sends no response (on an error the connection is closed, as Kafka does, so the client notices);
acks=1 answers once the leader has appended; acks=-1 refuses the write when the ISR is smaller than
`min.insync.replicas` and answers once the high watermark passes every partition's appended records
(the replica manager's delayed produce), or with REQUEST_TIMED_OUT for those it has not passed when
`timeout_ms` expires. That wait is answered `Later` (server/network.py): the connection goes on with
the producer's next requests while the followers fetch, and the answers go out in order. Errors are per partition; one bad partition loses nothing elsewhere. Lookup,
leadership and the append itself are the replica manager's (`ctx.replica_manager`).

Each partition's records are checked by `log_validator` as Kafka's LogValidator checks them, inline
within a small budget; sets past it (large ones, compressed ones that inflate far, legacy ones to
convert) are checked on the broker's worker pool, so the event loop never waits on them. A refused
partition gets Kafka's error code and, from v8, `error_message` and the KIP-467 `record_errors`
(batch_index of each bad record), so that a client fails only those records.

Batches of idempotent producers are checked against the partition's producer state
(`odradek.storage.producer_state`): a resent batch is answered NONE with its original base offset
and not appended again (as Kafka does; DUPLICATE_SEQUENCE_NUMBER is never sent), sequence gaps get
OUT_OF_ORDER_SEQUENCE_NUMBER and old epochs INVALID_PRODUCER_EPOCH.

A transactional batch that would start its transaction on a partition is first checked with the
transaction coordinator, or from v12 (the transaction protocol v2) added to the transaction by it
(KIP-890, `odradek.server.txn_verification`): the request awaits that before its appends.
"""

from __future__ import annotations

import asyncio
import logging

from typing import Any

from odradek.cluster.topics import INTERNAL_TOPICS
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import produce as m
from odradek.server.context import RequestContext
from odradek.server.log_validator import (
    LOG_APPEND_TIME, InvalidRecords, NeedsWorker, Validated, needs_worker, topic_rules, validate,
)
from odradek.server.metadata_cache import MetadataImage
from odradek.server.network import ConnectionClosing, Later
from odradek.server.partition import Partition
from odradek.server.txn_verification import ProduceVerification, verify_produce
from odradek.server.workers import Workers
from odradek.storage.errors import StorageError
from odradek.storage.producer_state import ProducerStateError

log = logging.getLogger("odradek.produce")

ADMIN_CLIENT_ID = "__admin_client"  # the one client id Kafka lets write internal topics


def _error(index: int, code: ErrorCode, message: str | None = None,
           record_errors: list[tuple[int, str | None]] | None = None) -> m.PartitionProduceResponse:
    return m.PartitionProduceResponse(
        index=index, error_code=code, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
        error_message=message,
        record_errors=[m.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=text)
                       for i, text in record_errors or ()])


async def handle_produce(ctx: RequestContext, request: m.ProduceRequest) -> m.ProduceResponse | Later | None:
    now = ctx.clock()
    image = ctx.metadata.image
    acks = request.acks
    any_error = False
    interrupted: list[bool] = []
    waiting: list[tuple[Partition, int, m.PartitionProduceResponse]] = []   # acks=all, by appended end
    responses = []
    names = [_topic_name(ctx, image, topic) for topic in request.topic_data]
    verified = await verify_produce(
        ctx.coordinators.transactions.verifier, ctx.replica_manager.leader_partition, request.transactional_id,
        ctx.api_version, [(name, pd.index, pd.records) for name, topic in zip(names, request.topic_data)
                          for pd in topic.partition_data], now)
    for name, topic in zip(names, request.topic_data):
        out = [await _produce_partition(ctx, image, name, pd, acks, now, interrupted, waiting, verified)
               for pd in topic.partition_data]
        any_error = any_error or any(r.error_code for r in out)
        responses.append(m.TopicProduceResponse(name=topic.name, topic_id=topic.topic_id, partition_responses=out))
    if interrupted:
        raise asyncio.CancelledError()  # the connection is gone; every partition was still served
    if acks == 0:
        if any_error:
            raise ConnectionClosing()
        return None
    answer = m.ProduceResponse(responses=responses, throttle_time_ms=0)
    if waiting:
        required = [(p, end) for p, end, _ in waiting]
        codes = ctx.replica_manager.acks_done(required)
        if codes is None:
            # Appended; the followers still have to fetch it. The connection goes on with the requests
            # behind this one meanwhile (network.Later), answering in order.
            return Later(_acknowledged(ctx, required, waiting, answer, request.timeout_ms))
        _set_codes(waiting, codes)
    return answer


async def _acknowledged(ctx: RequestContext, required: list[tuple[Partition, int]],
                        waiting: list[tuple[Partition, int, m.PartitionProduceResponse]],
                        answer: m.ProduceResponse, timeout_ms: int) -> m.ProduceResponse:
    _set_codes(waiting, await ctx.replica_manager.wait_for_acks(required, timeout_ms))
    return answer


def _set_codes(waiting: list[tuple[Partition, int, m.PartitionProduceResponse]], codes: list[ErrorCode]) -> None:
    for (_, _, response), code in zip(waiting, codes):
        if code:
            response.error_code = code


def _topic_name(ctx: RequestContext, image: MetadataImage, topic: m.TopicProduceData) -> str | None:
    if ctx.api_version >= 13:
        info = image.topic_by_id(topic.topic_id)
        return info.name if info is not None else None
    return topic.name


async def _produce_partition(ctx: RequestContext, image: MetadataImage, name: str | None, pd: m.PartitionProduceData,
                             acks: int, now: int, interrupted: list[bool],
                             waiting: list[tuple[Partition, int, m.PartitionProduceResponse]],
                             verified: ProduceVerification) -> m.PartitionProduceResponse:
    rm = ctx.replica_manager
    if acks not in (-1, 0, 1):
        return _error(pd.index, ErrorCode.INVALID_REQUIRED_ACKS)
    if name is None:
        code = ErrorCode.UNKNOWN_TOPIC_ID if ctx.api_version >= 13 else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return _error(pd.index, code)
    try:
        part = rm.leader_partition(name, pd.index)
    except KafkaApiError as e:
        return _error(pd.index, e.code)
    if name in INTERNAL_TOPICS and ctx.header.client_id != ADMIN_CLIENT_ID:
        # Only the coordinators write their own topics (Kafka: internalTopicsAllowed).
        return _error(pd.index, ErrorCode.INVALID_TOPIC_EXCEPTION, f"Cannot append to internal topic {name}")
    refused = verified.error(name, pd.index)
    if refused is not None:
        return _error(pd.index, refused[0], refused[1])
    try:
        rules = topic_rules(image.topic_config(name))
        try:
            if needs_worker(pd.records):
                raise NeedsWorker()
            validated = validate(pd.records, rules, now, ctx.api_version, inline=True)
        except NeedsWorker:
            validated = await _validate_on_workers(ctx.workers, interrupted, pd.records, rules, now, ctx.api_version)
            part = rm.leader_partition(name, pd.index)  # it may have moved while the worker ran
        verified.check(part, name, pd.index)
        result = rm.append_to_leader(part, validated.buffer, now, log_append_time=rules.timestamp_type == LOG_APPEND_TIME,
                                     required_acks=acks)
    except KafkaApiError as e:     # no longer the leader, or too few in-sync replicas for acks=all
        return _error(pd.index, e.code)
    except InvalidRecords as e:
        log.debug("produce to %s-%d refused: %s", name, pd.index, e.message)
        return _error(pd.index, e.error, e.message, e.record_errors)
    except ProducerStateError as e:
        # Sequence and epoch errors are the producer's to handle, not a broker fault.
        log.debug("produce to %s-%d refused: %s", name, pd.index, e)
        return _error(pd.index, e.error_code, str(e))
    except StorageError as e:
        log.error("append to %s-%d failed: %s", name, pd.index, e)
        return _error(pd.index, ErrorCode.KAFKA_STORAGE_ERROR, str(e))
    response = m.PartitionProduceResponse(
        index=pd.index, error_code=ErrorCode.NONE, base_offset=result.base_offset,
        log_append_time_ms=result.log_append_time, log_start_offset=result.log_start_offset)
    if acks == -1:
        waiting.append((part, result.last_offset + 1, response))
    return response


async def _validate_on_workers(workers: Workers, interrupted: list[bool], *args: Any) -> Validated:
    """`validate(*args)` on the worker pool. A client may close its connection right after sending
    (an acks=0 producer that is done does): that cancels the request's task, but Kafka still appends
    a request it has read, so the validation is awaited to its end and `interrupted` marks the
    request for the handler to re-raise the cancellation once every partition is served."""
    job = asyncio.ensure_future(workers.run(validate, *args))
    job.add_done_callback(_retrieve)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        if job.cancelled() or interrupted:
            raise
        interrupted.append(True)
        return await job


def _retrieve(job: asyncio.Future[Any]) -> None:
    """Mark a job's outcome as seen, so a job left behind by a second cancellation logs nothing."""
    if not job.cancelled():
        job.exception()
