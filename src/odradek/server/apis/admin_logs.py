"""Partition logs: DescribeLogDirs (35), DeleteRecords (21) and OffsetForLeaderEpoch (23).
Seed 003, "DescribeLogDirs API", "DeleteRecords API", "OffsetForLeaderEpoch API".

- DescribeLogDirs: every log dir (absolute path) with the size of each partition in it, offset lag
  max(high watermark - log end offset, 0) (always 0 on a leader) and, from v4, the file system's total
  and usable bytes. A null topic list means every partition. No future replicas and no cordoned dirs.
- DeleteRecords: moves a partition's log start offset up to the requested offset (-1: the high
  watermark); offsets above the high watermark are OFFSET_OUT_OF_RANGE, compact-only topics
  POLICY_VIOLATION, internal topics INVALID_TOPIC_EXCEPTION. Segments wholly below the new start are
  deleted at once; a consumer fetching below it gets OFFSET_OUT_OF_RANGE. The answer is the new low
  watermark. One broker holds every replica, so nothing waits for followers.
- OffsetForLeaderEpoch: the largest epoch at or below the requested one and the offset where the next
  epoch starts (the log end offset for the current epoch), from the leader-epoch cache. The current
  leader epoch, when given (v2+), fences as Fetch does: older is FENCED_LEADER_EPOCH, newer
  UNKNOWN_LEADER_EPOCH. Only the leader answers. The replica id (v3+) changes nothing here: Kafka
  uses it only to choose which ACL to check.
"""

from __future__ import annotations

import logging
import shutil

from odradek.cluster.topics import INTERNAL_TOPICS
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import delete_records as dr
from odradek.protocol.messages import describe_log_dirs as dld
from odradek.protocol.messages import offset_for_leader_epoch as ofle
from odradek.storage.errors import OffsetOutOfRangeError, StorageError

log = logging.getLogger("odradek.admin")

HIGH_WATERMARK = -1
UNDEFINED_EPOCH = -1
LONG_MAX = 2**63 - 1


# ------------------------------------------------------------------------------------------ DescribeLogDirs
def _disk_usage(path) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return min(usage.total, LONG_MAX), min(usage.free, LONG_MAX)


def _describe_dir(broker, log_dir, wanted: set | None) -> dld.DescribeLogDirsResult:
    path = str(log_dir.absolute())
    try:
        total, usable = _disk_usage(log_dir)
    except OSError as e:
        log.error("cannot read the file system of log dir %s: %s", path, e)
        return dld.DescribeLogDirsResult(error_code=ErrorCode.KAFKA_STORAGE_ERROR, log_dir=path, topics=[])
    by_topic: dict[str, list] = {}
    for (topic, p), lg in sorted(broker.logs.logs()):
        if broker.logs.log_dir_of(topic, p) != log_dir or (wanted is not None and (topic, p) not in wanted):
            continue
        part = broker.partition(topic, p)
        lag = max(part.high_watermark - lg.log_end_offset, 0) if part is not None else -1
        by_topic.setdefault(topic, []).append(dld.DescribeLogDirsPartition(
            partition_index=p, partition_size=lg.size_bytes, offset_lag=lag, is_future_key=False))
    return dld.DescribeLogDirsResult(
        error_code=ErrorCode.NONE, log_dir=path, total_bytes=total, usable_bytes=usable, is_cordoned=False,
        topics=[dld.DescribeLogDirsTopic(name=t, partitions=ps) for t, ps in by_topic.items()])


async def handle_describe_log_dirs(ctx, request: dld.DescribeLogDirsRequest) -> dld.DescribeLogDirsResponse:
    broker = ctx.broker
    wanted = None if request.topics is None else {(t.topic, p) for t in request.topics for p in t.partitions}
    results = [_describe_dir(broker, d, wanted) for d in broker.logs.log_dirs]
    return dld.DescribeLogDirsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, results=results)


# ------------------------------------------------------------------------------------------ DeleteRecords
def delete_records(broker, topic: str, index: int, offset: int, now_ms: int) -> tuple[ErrorCode, int]:
    """(error, low watermark) for one partition, as ReplicaManager.deleteRecordsOnLocalLog."""
    info = broker.topics.get(topic)
    if info is None or index not in info.partitions:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1
    if topic in INTERNAL_TOPICS:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, -1
    part = broker.partition(topic, index)
    if part is None or not part.is_leader:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, -1
    if not broker.topic_config(topic).delete:
        return ErrorCode.POLICY_VIOLATION, -1
    target = part.high_watermark if offset == HIGH_WATERMARK else offset
    if target < 0 or target > part.high_watermark:
        return ErrorCode.OFFSET_OUT_OF_RANGE, -1
    try:
        part.log.update_high_watermark(part.high_watermark)  # the log's copy may lag the partition's
        part.log.delete_records_before(target, now_ms)
    except OffsetOutOfRangeError:
        return ErrorCode.OFFSET_OUT_OF_RANGE, -1
    except StorageError as e:
        log.error("DeleteRecords on %s-%d failed: %s", topic, index, e)
        return ErrorCode.KAFKA_STORAGE_ERROR, -1
    return ErrorCode.NONE, part.log_start_offset


async def handle_delete_records(ctx, request: dr.DeleteRecordsRequest) -> dr.DeleteRecordsResponse:
    broker = ctx.broker
    now = broker.clock()
    topics = []
    for t in request.topics:
        partitions = []
        for p in t.partitions:
            error, low = delete_records(broker, t.name, p.partition_index, p.offset, now)
            partitions.append(dr.DeleteRecordsPartitionResult(partition_index=p.partition_index,
                                                              low_watermark=low, error_code=error))
        topics.append(dr.DeleteRecordsTopicResult(name=t.name, partitions=partitions))
    return dr.DeleteRecordsResponse(throttle_time_ms=0, topics=topics)


# ------------------------------------------------------------------------------------------ OffsetForLeaderEpoch
def end_offset_for_epoch(part, epoch: int) -> tuple[int, int] | None:
    """(epoch, end offset) or None. Kafka's leader writes (its epoch, log end offset) into the cache
    when it takes over; this broker writes the entry with the epoch's first append, so until then the
    answer is computed as if the entry were there."""
    if epoch == UNDEFINED_EPOCH:
        return None
    lg = part.log
    latest = lg.leader_epoch_cache.latest_epoch
    if latest is None or latest < part.leader_epoch:
        if epoch > part.leader_epoch:
            return None
        if epoch == part.leader_epoch:
            return epoch, lg.log_end_offset
        if latest is None:
            return epoch, lg.log_end_offset
        if epoch > latest:
            return latest, lg.log_end_offset
    return lg.end_offset_for_epoch(epoch)


def _epoch_end_offset(broker, topic: str, p: ofle.OffsetForLeaderPartition, version: int) -> ofle.EpochEndOffset:
    part = broker.partition(topic, p.partition)
    if part is None:
        info = broker.topics.get(topic)
        code = ErrorCode.NOT_LEADER_OR_FOLLOWER if info is not None and p.partition in info.partitions \
            else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ofle.EpochEndOffset(error_code=code, partition=p.partition)
    current = p.current_leader_epoch if version >= 2 else UNDEFINED_EPOCH
    if current != UNDEFINED_EPOCH and current != part.leader_epoch:
        code = ErrorCode.FENCED_LEADER_EPOCH if current < part.leader_epoch else ErrorCode.UNKNOWN_LEADER_EPOCH
        return ofle.EpochEndOffset(error_code=code, partition=p.partition)
    if not part.is_leader:
        return ofle.EpochEndOffset(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, partition=p.partition)
    found = end_offset_for_epoch(part, p.leader_epoch)
    epoch, end = found if found is not None else (UNDEFINED_EPOCH, -1)
    return ofle.EpochEndOffset(error_code=ErrorCode.NONE, partition=p.partition, leader_epoch=epoch, end_offset=end)


async def handle_offset_for_leader_epoch(ctx, request: ofle.OffsetForLeaderEpochRequest):
    v = ctx.api_version
    topics = [ofle.OffsetForLeaderTopicResult(
        topic=t.topic, partitions=[_epoch_end_offset(ctx.broker, t.topic, p, v) for p in t.partitions])
        for t in request.topics]
    return ofle.OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)
