"""ListOffsets (key 2): offsets by time (seed 003, "ListOffsets API"; seed 004, "Offset API").

Special timestamps, as Kafka answers them without tiered storage: -2 earliest (the log start offset),
-1 latest (the high watermark, or the last stable offset for read_committed), -3 the record with the
largest timestamp (v7+, KIP-734), -4 earliest local (v8+, KIP-405: the local log start offset, here
the log start offset), -5 latest tiered (v9+, KIP-1005) and -6 earliest pending upload (v11+,
KIP-1023): with nothing tiered both are "no offset" (-1, epoch -1). Any other negative timestamp, or
one the request's version does not know, is UNSUPPORTED_VERSION for that partition (Kafka's
ReplicaManager.isListOffsetsTimestampUnsupported). A partition named twice is answered once, with
INVALID_REQUEST.

Any other timestamp: the first offset whose timestamp is at or after it, or -1 if there is none. The
search (storage/timestamps.py) is planned from the segment's indexes here and run on the broker's
worker pool: it reads a range the time index bounds, and past a batch whose header lies about its max
timestamp only a bounded budget more. Version 0 answers with a list of offsets ("old style"), here the
one offset asked for.
"""

from __future__ import annotations

import logging

from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import list_offsets as m
from odradek.server.context import RequestContext, Workers
from odradek.server.partition import Partition, PartitionLog
from odradek.storage.errors import StorageError

log = logging.getLogger("odradek.list_offsets")

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6
DEBUGGING_REPLICA_ID = -2

# The first version that may ask for each special timestamp (-1 and -2 from v0, which odradek serves).
MIN_VERSION_OF = {LATEST: 0, EARLIEST: 0, MAX_TIMESTAMP: 7, EARLIEST_LOCAL: 8, LATEST_TIERED: 9,
                  EARLIEST_PENDING_UPLOAD: 11}


def timestamp_unsupported(timestamp: int, version: int) -> bool:
    return timestamp < 0 and (timestamp not in MIN_VERSION_OF or version < MIN_VERSION_OF[timestamp])


async def lookup(workers: Workers, part: Partition, timestamp: int, isolation: int,
                 replica_id: int) -> tuple[int, int, int]:
    """(timestamp, offset, leader_epoch) for one partition."""
    log_ = part.log
    limit = part.fetch_limit(replica_id, isolation)
    if timestamp == LATEST:
        return -1, limit, part.leader_epoch
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return -1, part.log_start_offset, _epoch_at(log_, part.log_start_offset, part.leader_epoch)
    if timestamp in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        return -1, -1, -1
    found = None
    if timestamp == MAX_TIMESTAMP:
        scan = log_.max_timestamp_scan()
        if scan is not None:
            found = await workers.run(scan.run)
    else:
        for scan in log_.timestamp_scans(timestamp):
            found = await workers.run(scan.run)
            if found is not None:
                break
    if found is None or found[1] >= limit:
        return -1, -1, -1
    hit = log_.timestamp_and_offset(*found)
    return hit.timestamp, hit.offset, hit.leader_epoch if hit.leader_epoch is not None else -1


def _epoch_at(log_: PartitionLog, offset: int, default: int) -> int:
    epoch = log_.leader_epoch_cache.epoch_for_offset(offset)
    return default if epoch is None else epoch


def _duplicates(request: m.ListOffsetsRequest) -> set[tuple[str, int]]:
    seen: set[tuple[str, int]] = set()
    twice: set[tuple[str, int]] = set()
    for t in request.topics:
        for p in t.partitions:
            key = (t.name, p.partition_index)
            (twice if key in seen else seen).add(key)
    return twice


async def _answer(ctx: RequestContext, name: str, p: m.ListOffsetsPartition, isolation: int,
                  replica_id: int) -> m.ListOffsetsPartitionResponse:
    v = ctx.api_version
    index = p.partition_index
    if timestamp_unsupported(p.timestamp, v):
        return m.ListOffsetsPartitionResponse(partition_index=index, error_code=ErrorCode.UNSUPPORTED_VERSION)
    try:
        # Only the leader answers, but for Kafka's debugging replica id (-2).
        part = ctx.replica_manager.leader_partition(name, index, p.current_leader_epoch if v >= 4 else -1,
                                                    require_leader=replica_id != DEBUGGING_REPLICA_ID)
    except KafkaApiError as e:
        return m.ListOffsetsPartitionResponse(partition_index=index, error_code=e.code)
    try:
        ts, offset, epoch = await lookup(ctx.workers, part, p.timestamp, isolation, replica_id)
    except (StorageError, OSError) as e:   # a disk error: Kafka's KafkaStorageException
        log.error("ListOffsets on %s-%d failed: %s", name, index, e)
        return m.ListOffsetsPartitionResponse(partition_index=index, error_code=ErrorCode.KAFKA_STORAGE_ERROR)
    resp = m.ListOffsetsPartitionResponse(partition_index=index, error_code=ErrorCode.NONE,
                                          timestamp=ts, offset=offset, leader_epoch=epoch)
    if v == 0:
        resp.old_style_offsets = [offset] if offset >= 0 and p.max_num_offsets > 0 else []
    return resp


async def handle_list_offsets(ctx: RequestContext, request: m.ListOffsetsRequest) -> m.ListOffsetsResponse:
    v = ctx.api_version
    isolation = request.isolation_level if v >= 2 else 0
    twice = _duplicates(request)
    answered: set[tuple[str, int]] = set()
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            key = (t.name, p.partition_index)
            if key in answered:
                continue
            answered.add(key)
            if key in twice:
                parts.append(m.ListOffsetsPartitionResponse(partition_index=p.partition_index,
                                                            error_code=ErrorCode.INVALID_REQUEST))
            else:
                parts.append(await _answer(ctx, t.name, p, isolation, request.replica_id))
        if parts:
            topics.append(m.ListOffsetsTopicResponse(name=t.name, partitions=parts))
    return m.ListOffsetsResponse(throttle_time_ms=0, topics=topics)
