"""Fetch (key 1): read from partition logs, waiting for data when asked (seed 003, "The Consumer",
"Fetch API"; seed 004, "Fetch API"; KIP-227 fetch sessions in `fetch_session.py`).

- Long poll: when fewer than `min_bytes` are available the request waits up to `max_wait_ms` and is
  answered as soon as an append to any of its partitions brings enough data.
- `max_bytes` bounds the response and `partition_max_bytes` each partition, but the first partition
  with data always returns at least one whole batch, so a consumer can never be stuck behind a batch
  larger than its limits.
- Consumers read below the high watermark (read_uncommitted) or the last stable offset
  (read_committed); followers (replica id >= 0) read to the log end.
- Versions 0-3 predate record batch v2: their records are down-converted to magic 0 (v0-1) or 1 (v2-3).
"""

from __future__ import annotations

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import fetch as m
from odradek.records.convert import v2_to_legacy
from odradek.server.record_slices import RecordSlices
from odradek.storage.errors import OffsetOutOfRangeError

READ_COMMITTED = 1


def _replica_id(request: m.FetchRequest, version: int) -> int:
    return request.replica_state.replica_id if version >= 15 else request.replica_id


def read_partitions(broker, wanted, *, version: int, max_bytes: int, isolation: int, replica_id: int):
    """(responses by topic, bytes read, any error) for [(topic, topic_id, [FetchPartition])]."""
    remaining = max_bytes
    total = 0
    any_error = False
    out = []
    for topic, topic_id, partitions in wanted:
        datas = []
        for fp in partitions:
            part = broker.partition(topic, fp.partition) if topic is not None else None
            if part is None:
                code = ErrorCode.UNKNOWN_TOPIC_ID if topic is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                datas.append(m.PartitionData(partition_index=fp.partition, error_code=code, high_watermark=-1,
                                             records=b""))
                any_error = True
                continue
            hw = part.high_watermark
            lso = part.last_stable_offset
            if replica_id >= 0:
                limit = part.log_end_offset
            else:
                limit = lso if isolation == READ_COMMITTED else hw
            pd = m.PartitionData(partition_index=fp.partition, error_code=ErrorCode.NONE, high_watermark=hw,
                                 last_stable_offset=lso, log_start_offset=part.log_start_offset,
                                 aborted_transactions=[] if isolation == READ_COMMITTED else None,
                                 records=b"")
            if fp.current_leader_epoch >= 0 and fp.current_leader_epoch != part.leader_epoch:
                pd.error_code = (ErrorCode.FENCED_LEADER_EPOCH if fp.current_leader_epoch < part.leader_epoch
                                 else ErrorCode.UNKNOWN_LEADER_EPOCH)
                any_error = True
            elif fp.fetch_offset > part.log_end_offset or fp.fetch_offset < part.log_start_offset:
                pd.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                any_error = True
            elif fp.fetch_offset < limit and remaining > 0:
                budget = min(fp.partition_max_bytes, remaining)
                try:
                    slices = part.log.read(fp.fetch_offset, budget, limit, min_one_batch=(total == 0))
                except OffsetOutOfRangeError:
                    pd.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
                    any_error = True
                    slices = []
                if slices:
                    rs = RecordSlices(slices)
                    if version < 4:
                        pd.records = v2_to_legacy(rs.read(), 0 if version < 2 else 1)
                        size = len(pd.records)
                    else:
                        pd.records = rs
                        size = rs.size
                    total += size
                    remaining -= size
            datas.append(pd)
        out.append(m.FetchableTopicResponse(topic=topic or "", topic_id=topic_id, partitions=datas))
    return out, total, any_error


async def handle_fetch(ctx, request: m.FetchRequest) -> m.FetchResponse:
    broker = ctx.broker
    v = ctx.api_version
    replica_id = _replica_id(request, v)
    isolation = request.isolation_level if v >= 4 else 0
    max_bytes = request.max_bytes if v >= 3 else 0x7FFFFFFF
    sessions = broker.fetch_sessions
    session, error = sessions.update(request, v, broker)
    if error:
        return m.FetchResponse(throttle_time_ms=0, error_code=error, session_id=0, responses=[])
    wanted = session.wanted(request, v, broker) if session is not None else _wanted(request, v, broker)
    loop_time = broker.clock
    deadline = loop_time() + max(request.max_wait_ms, 0)
    while True:
        responses, total, any_error = read_partitions(
            broker, wanted, version=v, max_bytes=max_bytes, isolation=isolation, replica_id=replica_id)
        if total >= max(request.min_bytes, 1) or any_error or not wanted:
            break
        wait_ms = deadline - loop_time()
        keys = [(t, fp.partition) for t, _, parts in wanted for fp in parts]
        if wait_ms <= 0 or not await broker.purgatory.wait_any(keys, wait_ms / 1000):
            responses, total, any_error = read_partitions(
                broker, wanted, version=v, max_bytes=max_bytes, isolation=isolation, replica_id=replica_id)
            break
    if session is not None:
        responses = session.filter_response(responses, v)
    return m.FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                           session_id=session.id if session is not None else 0, responses=responses)


def _wanted(request: m.FetchRequest, version: int, broker):
    out = []
    for t in request.topics:
        if version >= 13:
            info = broker.topic_by_id(t.topic_id)
            out.append((info.name if info else None, t.topic_id, t.partitions))
        else:
            out.append((t.topic, t.topic_id, t.partitions))
    return out
