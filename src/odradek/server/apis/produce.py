"""Produce (key 0): validate each partition's record set and append it to the partition's log
(seed 003, "The Producer" and "Produce API"; DESIGN, "How data flows": Produce).

acks=0 sends no response (on an error the connection is closed, as Kafka does, so the client notices);
acks=1 answers once the leader has appended; acks=-1 answers once the high watermark passes the
appended records or `timeout_ms` expires, and refuses the write when the ISR is smaller than
`min.insync.replicas`. Errors are per partition; one bad partition loses nothing elsewhere.

Batches of idempotent producers are checked against the partition's producer state
(`odradek.storage.producer_state`): a resent batch is answered NONE with its original base offset
and not appended again (as Kafka does; DUPLICATE_SEQUENCE_NUMBER is never sent), sequence gaps get
OUT_OF_ORDER_SEQUENCE_NUMBER and old epochs INVALID_PRODUCER_EPOCH.
"""

from __future__ import annotations

import logging

from odradek.cluster.topics import INTERNAL_TOPICS
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import produce as m
from odradek.server.log_validator import (
    CREATE_TIME, LOG_APPEND_TIME, InvalidRecords, TopicRules, validate,
)
from odradek.server.config import TopicConfig
from odradek.server.network import ConnectionClosing
from odradek.storage.errors import StorageError
from odradek.storage.producer_state import ProducerStateError

log = logging.getLogger("odradek.produce")

ADMIN_CLIENT_ID = "__admin_client"  # the one client id Kafka lets write internal topics


def _error(index: int, code: ErrorCode, message: str | None = None) -> m.PartitionProduceResponse:
    return m.PartitionProduceResponse(index=index, error_code=code, base_offset=-1, log_append_time_ms=-1,
                                      log_start_offset=-1, error_message=message)


def topic_rules(tc: TopicConfig) -> TopicRules:
    return TopicRules(
        max_message_bytes=tc.get_value("max.message.bytes"),
        timestamp_type=LOG_APPEND_TIME if tc.get_value("message.timestamp.type") == "LogAppendTime" else CREATE_TIME,
        timestamp_before_max_ms=tc.message_timestamp_before_max_ms,
        timestamp_after_max_ms=tc.message_timestamp_after_max_ms,
        compacted=tc.compact,
    )


async def handle_produce(ctx, request: m.ProduceRequest) -> m.ProduceResponse | None:
    broker = ctx.broker
    now = broker.clock()
    acks = request.acks
    any_error = False
    responses = []
    for topic in request.topic_data:
        name = topic.name
        if ctx.api_version >= 13:
            info = broker.topic_by_id(topic.topic_id)
            name = info.name if info is not None else None
        out = []
        for pd in topic.partition_data:
            if acks not in (-1, 0, 1):
                out.append(_error(pd.index, ErrorCode.INVALID_REQUIRED_ACKS))
                continue
            part = broker.partition(name, pd.index) if name is not None else None
            if part is None:
                code = ErrorCode.UNKNOWN_TOPIC_ID if ctx.api_version >= 13 and name is None \
                    else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                out.append(_error(pd.index, code))
                continue
            if not part.is_leader:
                out.append(_error(pd.index, ErrorCode.NOT_LEADER_OR_FOLLOWER))
                continue
            if name in INTERNAL_TOPICS and ctx.header.client_id != ADMIN_CLIENT_ID:
                # Only the coordinators write their own topics (Kafka: internalTopicsAllowed).
                out.append(_error(pd.index, ErrorCode.INVALID_TOPIC_EXCEPTION,
                                  f"Cannot append to internal topic {name}"))
                continue
            try:
                rules = topic_rules(broker.topic_config(name))
                validated = validate(pd.records, rules, now)
                result = broker.replica_manager.append_to_leader(
                    part, validated.buffer, now, log_append_time=rules.timestamp_type == LOG_APPEND_TIME,
                    required_acks=acks)
            except KafkaApiError as e:
                out.append(_error(pd.index, e.code))
                continue
            except InvalidRecords as e:
                out.append(_error(pd.index, e.error, e.message))
                continue
            except ProducerStateError as e:
                # Sequence and epoch errors are the producer's to handle, not a broker fault.
                log.debug("produce to %s-%d refused: %s", name, pd.index, e)
                out.append(_error(pd.index, e.error_code, str(e)))
                continue
            except StorageError as e:
                log.error("append to %s-%d failed: %s", name, pd.index, e)
                out.append(_error(pd.index, ErrorCode.KAFKA_STORAGE_ERROR, str(e)))
                continue
            out.append(m.PartitionProduceResponse(
                index=pd.index, error_code=ErrorCode.NONE, base_offset=result.base_offset,
                log_append_time_ms=result.log_append_time, log_start_offset=result.log_start_offset))
        any_error = any_error or any(r.error_code for r in out)
        responses.append(m.TopicProduceResponse(name=topic.name, topic_id=topic.topic_id, partition_responses=out))
    if acks == 0:
        if any_error:
            raise ConnectionClosing()
        return None
    return m.ProduceResponse(responses=responses, throttle_time_ms=0)
