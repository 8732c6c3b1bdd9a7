"""ListOffsets (key 2): offsets by time (seed 003, "ListOffsets API"; seed 004, "Offset API").

Special timestamps: -2 earliest (the log start offset), -1 latest (the high watermark, or the last
stable offset for read_committed), -3 the record with the largest timestamp (v7+, KIP-734), -4 earliest
local and -5 earliest pending upload (KIP-405; without tiered storage both are the log start offset).
Any other timestamp: the first offset whose timestamp is at or after it, or -1 if there is none.
Version 0 answers with a list of offsets ("old style"), here the one offset asked for.
"""

from __future__ import annotations

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import list_offsets as m

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
EARLIEST_PENDING_UPLOAD = -5
READ_COMMITTED = 1


def lookup(part, timestamp: int, isolation: int, replica_id: int) -> tuple[int, int, int]:
    """(timestamp, offset, leader_epoch) for one partition."""
    log = part.log
    limit = part.log_end_offset if replica_id >= 0 else (
        part.last_stable_offset if isolation == READ_COMMITTED else part.high_watermark)
    if timestamp == LATEST:
        return -1, limit, part.leader_epoch
    if timestamp in (EARLIEST, EARLIEST_LOCAL, EARLIEST_PENDING_UPLOAD):
        return -1, part.log_start_offset, _epoch_at(log, part.log_start_offset, part.leader_epoch)
    if timestamp == MAX_TIMESTAMP:
        found = log.max_timestamp_and_offset()
    else:
        found = log.offset_for_timestamp(timestamp)
    if found is None or found.offset >= limit:
        return -1, -1, -1
    epoch = found.leader_epoch if found.leader_epoch is not None else -1
    return found.timestamp, found.offset, epoch


def _epoch_at(log, offset: int, default: int) -> int:
    epoch = log.leader_epoch_cache.epoch_for_offset(offset)
    return default if epoch is None else epoch


async def handle_list_offsets(ctx, request: m.ListOffsetsRequest) -> m.ListOffsetsResponse:
    broker = ctx.broker
    v = ctx.api_version
    isolation = request.isolation_level if v >= 2 else 0
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            part = broker.partition(t.name, p.partition_index)
            if part is None:
                parts.append(m.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            if v >= 4 and p.current_leader_epoch >= 0 and p.current_leader_epoch != part.leader_epoch:
                code = (ErrorCode.FENCED_LEADER_EPOCH if p.current_leader_epoch < part.leader_epoch
                        else ErrorCode.UNKNOWN_LEADER_EPOCH)
                parts.append(m.ListOffsetsPartitionResponse(partition_index=p.partition_index, error_code=code))
                continue
            ts, offset, epoch = lookup(part, p.timestamp, isolation, request.replica_id)
            resp = m.ListOffsetsPartitionResponse(partition_index=p.partition_index, error_code=ErrorCode.NONE,
                                                  timestamp=ts, offset=offset, leader_epoch=epoch)
            if v == 0:
                resp.old_style_offsets = [offset] if offset >= 0 and p.max_num_offsets > 0 else []
            parts.append(resp)
        topics.append(m.ListOffsetsTopicResponse(name=t.name, partitions=parts))
    return m.ListOffsetsResponse(throttle_time_ms=0, topics=topics)
