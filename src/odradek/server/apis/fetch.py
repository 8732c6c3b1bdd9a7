"""Fetch (key 1): read from partition logs, waiting for data when asked (seed 003, "The Consumer",
"Fetch API"; seed 004, "Fetch API"; KIP-227 fetch sessions in `fetch_session.py`).

- The partitions of a request are a set, as in Kafka (its FetchRequest.fetchData is an insertion-ordered
  map keyed by topic, or topic id from v13, and partition): a partition named again keeps its first
  place, takes the later entry's fetch position, and is answered once. Consecutive partitions of one
  topic share a topic entry in the response, in request order.
- Long poll: when fewer than `min_bytes` are available the request waits up to `max_wait_ms` and is
  answered as soon as an append to any of its partitions brings enough data.
- Limits: the response is bounded by min(`max_bytes` (v3+), `fetch.max.bytes`) and each partition by
  `partition_max_bytes`. From v3 (KIP-74) the first partition with data returns at least one whole
  batch even beyond them, so a consumer is never stuck behind a batch larger than its limits. Before
  v3 the limits are hard, as in Kafka: a first batch larger than `partition_max_bytes` is answered
  with a partial message (an overflow entry), which those readers report as a message too large for
  their fetch size, and a partition the response limit cuts is left for the next fetch.
- Consumers read below the high watermark (read_uncommitted) or the last stable offset
  (read_committed); followers (replica id >= 0) read to the log end.
- Versions 0-3 predate record batch v2: their records are down-converted to magic 0 (v0-1) or 1
  (v2-3) lazily, a bounded chunk at a time on the worker pool while the response is sent (KIP-283,
  `record_slices.LegacyRecords`); a topic with `message.downconversion.enable=false` answers
  UNSUPPORTED_VERSION to them instead. A range of control batches only converts to nothing: it is
  answered empty (Kafka sends an overflow entry that readers report as an error) and counts for
  nothing against `min_bytes`, so such a reader waits for data like any other.
"""

from __future__ import annotations

import logging
import struct

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages import fetch as m
from odradek.server.record_slices import LegacyRecords, RecordSlices
from odradek.storage.errors import OffsetOutOfRangeError, StorageError

log = logging.getLogger("odradek.fetch")

READ_COMMITTED = 1
INT32_MAX = 2**31 - 1
# A partial legacy entry: offset -1 and a message size past the end (Kafka's overflow batch).
OVERSIZED_FIRST_BATCH = struct.pack(">qi", -1, 61)


def _replica_id(request: m.FetchRequest, version: int) -> int:
    return request.replica_state.replica_id if version >= 15 else request.replica_id


def _records_size(records) -> int:
    return records.size if hasattr(records, "size") else len(records)


def read_partitions(broker, wanted, *, version: int, max_bytes: int, isolation: int, replica_id: int):
    """(responses by topic, bytes read, any error) for [(topic, topic_id, [FetchPartition])]."""
    remaining = max_bytes
    total = 0
    any_error = False
    out = []
    for topic, topic_id, partitions in wanted:
        datas = []
        for fp in partitions:
            pd, size = _read_partition(broker, topic, fp, version=version, remaining=remaining,
                                       first=total == 0, isolation=isolation, replica_id=replica_id)
            any_error = any_error or pd.error_code != ErrorCode.NONE
            total += size
            remaining -= size
            datas.append(pd)
        out.append(m.FetchableTopicResponse(topic=topic or "", topic_id=topic_id, partitions=datas))
    return out, total, any_error


def _read_partition(broker, topic, fp, *, version: int, remaining: int, first: bool, isolation: int,
                    replica_id: int) -> tuple[m.PartitionData, int]:
    part = broker.partition(topic, fp.partition) if topic is not None else None
    if part is None:
        code = ErrorCode.UNKNOWN_TOPIC_ID if topic is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return m.PartitionData(partition_index=fp.partition, error_code=code, high_watermark=-1, records=b""), 0
    hw = part.high_watermark
    lso = part.last_stable_offset
    if replica_id >= 0:
        limit = part.log_end_offset
    else:
        limit = lso if isolation == READ_COMMITTED else hw
    pd = m.PartitionData(partition_index=fp.partition, error_code=ErrorCode.NONE, high_watermark=hw,
                         last_stable_offset=lso, log_start_offset=part.log_start_offset,
                         aborted_transactions=[] if isolation == READ_COMMITTED else None, records=b"")
    if fp.current_leader_epoch >= 0 and fp.current_leader_epoch != part.leader_epoch:
        pd.error_code = (ErrorCode.FENCED_LEADER_EPOCH if fp.current_leader_epoch < part.leader_epoch
                         else ErrorCode.UNKNOWN_LEADER_EPOCH)
        return pd, 0
    if fp.fetch_offset > part.log_end_offset or fp.fetch_offset < part.log_start_offset:
        pd.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
        return pd, 0
    if version < 4 and replica_id < 0 and \
            not broker.topic_config(topic).get_value("message.downconversion.enable"):
        pd.error_code = ErrorCode.UNSUPPORTED_VERSION
        return pd, 0
    if fp.fetch_offset >= limit or remaining <= 0:
        return pd, 0
    budget = min(fp.partition_max_bytes, remaining)
    try:
        # Before v3 a whole first batch is asked for only to tell "too large" from "nothing".
        slices = part.log.read(fp.fetch_offset, budget, limit, min_one_batch=first or version < 3)
    except OffsetOutOfRangeError:
        pd.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
        return pd, 0
    except (StorageError, OSError) as e:   # a disk error: Kafka's KafkaStorageException
        log.error("fetch from %s-%d failed: %s", topic, fp.partition, e)
        pd.error_code = ErrorCode.KAFKA_STORAGE_ERROR
        return pd, 0
    size = sum(s.length for s in slices)
    if version < 3 and size > budget:
        if budget < fp.partition_max_bytes:
            return pd, 0      # the response is full; the next fetch gets it
        pd.records = OVERSIZED_FIRST_BATCH
        return pd, len(OVERSIZED_FIRST_BATCH)
    if slices:
        pd.records = RecordSlices(slices)
    return pd, size


async def down_convert(broker, wanted, responses, magic: int) -> tuple[int, bool]:
    """Replace the stored batches of every partition by their lazy conversion to `magic` messages
    (the first batch converted now, on the worker pool, to size them); (bytes answered, any error)."""
    total = 0
    any_error = False
    for (_, _, asked), topic_resp in zip(wanted, responses):
        for fp, pd in zip(asked, topic_resp.partitions):
            if isinstance(pd.records, RecordSlices):
                try:
                    converted = await LegacyRecords.convert_first(pd.records.slices, magic, fp.fetch_offset,
                                                                  broker.workers)
                except (ProtocolError, StorageError, OSError) as e:
                    log.error("down-converting %s-%d failed: %s", topic_resp.topic, pd.partition_index, e)
                    pd.error_code = (ErrorCode.CORRUPT_MESSAGE if isinstance(e, ProtocolError)
                                     else ErrorCode.KAFKA_STORAGE_ERROR)
                    converted = None
                    any_error = True
                pd.records = converted if converted is not None else b""
            total += _records_size(pd.records)
    return total, any_error


async def handle_fetch(ctx, request: m.FetchRequest) -> m.FetchResponse:
    broker = ctx.broker
    v = ctx.api_version
    replica_id = _replica_id(request, v)
    isolation = request.isolation_level if v >= 4 else 0
    max_bytes = min(request.max_bytes if v >= 3 else INT32_MAX, broker.config.get("fetch.max.bytes"))
    min_bytes = min(max(request.min_bytes, 1), max_bytes)
    sessions = broker.fetch_sessions
    session, error = sessions.update(request, v, broker)
    if error:
        return m.FetchResponse(throttle_time_ms=0, error_code=error, session_id=0, responses=[])
    wanted = session.wanted(request, v, broker) if session is not None else _wanted(request, v, broker)
    loop_time = broker.clock
    deadline = loop_time() + max(request.max_wait_ms, 0)

    async def read():
        responses, total, any_error = read_partitions(
            broker, wanted, version=v, max_bytes=max_bytes, isolation=isolation, replica_id=replica_id)
        if v < 4:
            total, convert_error = await down_convert(broker, wanted, responses, 0 if v < 2 else 1)
            any_error = any_error or convert_error
        return responses, total, any_error

    while True:
        responses, total, any_error = await read()
        if total >= min_bytes or any_error or not wanted:
            break
        wait_ms = deadline - loop_time()
        keys = [(t, fp.partition) for t, _, parts in wanted for fp in parts]
        if wait_ms <= 0 or not await broker.purgatory.wait_any(keys, wait_ms / 1000):
            responses, total, any_error = await read()
            break
    if session is not None:
        responses = session.filter_response(responses, v)
    return m.FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                           session_id=session.id if session is not None else 0, responses=responses)


def _wanted(request: m.FetchRequest, version: int, broker):
    """[(topic name or None, topic id, [FetchPartition])]: each partition once, Kafka's way."""
    chosen: dict[tuple, tuple] = {}
    for t in request.topics:
        if version >= 13:
            info = broker.topic_by_id(t.topic_id)
            name, ident = (info.name if info else None), t.topic_id
        else:
            name, ident = t.topic, t.topic
        for fp in t.partitions:
            chosen[(ident, fp.partition)] = (name, t.topic_id, fp)   # an existing key keeps its place
    out: list[tuple] = []
    for name, topic_id, fp in chosen.values():
        if out and out[-1][0] == name and out[-1][1] == topic_id:
            out[-1][2].append(fp)
        else:
            out.append((name, topic_id, [fp]))
    return out
