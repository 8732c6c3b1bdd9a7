"""Partition logs: DescribeLogDirs (35), AlterReplicaLogDirs (34), DeleteRecords (21) and
OffsetForLeaderEpoch (23). Seed 003, "DescribeLogDirs API", "AlterReplicaLogDirs API", "DeleteRecords
API", "OffsetForLeaderEpoch API".

- DescribeLogDirs: every log dir (absolute path) with the size of each partition in it, offset lag
  max(high watermark - log end offset, 0) (always 0 on a leader) and, from v4, the file system's total
  and usable bytes. A null topic list means every partition. A replica being moved shows in its
  destination dir too, with is_future_key and the lag current log end - future log end, as in Kafka;
  after a restart at once, the move being resumed where its copy stood. No cordoned dirs.
- AlterReplicaLogDirs: moves each named replica to the named log dir of this broker (by absolute
  path), in the background (`storage/log_mover.py`): NONE once the move is under way (or nothing is
  to be done), LOG_DIR_NOT_FOUND for a path that is not one of log.dirs, KAFKA_STORAGE_ERROR for a
  log dir that is gone or unwritable, REPLICA_NOT_AVAILABLE for a partition without a replica here (the
  dir is remembered for when one is created, as Kafka does), INVALID_TOPIC_EXCEPTION when the future
  dir's name would be too long. A partition named twice in one request takes the last path.
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
from pathlib import Path

from odradek.protocol.error_codes import ErrorCode, KafkaApiError, for_code
from odradek.protocol.messages import alter_replica_log_dirs as arld
from odradek.protocol.messages import delete_records as dr
from odradek.protocol.messages import describe_log_dirs as dld
from odradek.protocol.messages import offset_for_leader_epoch as ofle
from odradek.server.context import RequestContext
from odradek.storage.errors import StorageError

log = logging.getLogger("odradek.admin")

UNDEFINED_EPOCH = -1
LONG_MAX = 2**63 - 1


# ------------------------------------------------------------------------------------------ DescribeLogDirs
def _disk_usage(path: Path) -> tuple[int, int]:
    usage = shutil.disk_usage(path)
    return min(usage.total, LONG_MAX), min(usage.free, LONG_MAX)


def _describe_dir(ctx: RequestContext, log_dir: Path, wanted: set | None) -> dld.DescribeLogDirsResult:
    path = str(log_dir.absolute())
    try:
        total, usable = _disk_usage(log_dir)
    except OSError as e:
        log.error("cannot read the file system of log dir %s: %s", path, e)
        return dld.DescribeLogDirsResult(error_code=ErrorCode.KAFKA_STORAGE_ERROR, log_dir=path, topics=[])
    dirs, replicas = ctx.log_dirs, ctx.replica_manager
    by_topic: dict[str, list] = {}
    for (topic, p), lg in sorted(dirs.logs(), key=lambda item: item[0]):
        if dirs.log_dir_of(topic, p) != log_dir or (wanted is not None and (topic, p) not in wanted):
            continue
        part = replicas.get_partition(topic, p)
        lag = max(part.high_watermark - lg.log_end_offset, 0) if part is not None else -1
        by_topic.setdefault(topic, []).append(dld.DescribeLogDirsPartition(
            partition_index=p, partition_size=lg.size_bytes, offset_lag=lag, is_future_key=False))
    for (topic, p), future, dest in dirs.future_logs():
        if dest != log_dir or (wanted is not None and (topic, p) not in wanted):
            continue
        current = dirs.get_log(topic, p)
        lag = current.log_end_offset - future.log_end_offset if current is not None else -1
        by_topic.setdefault(topic, []).append(dld.DescribeLogDirsPartition(
            partition_index=p, partition_size=future.size_bytes, offset_lag=lag, is_future_key=True))
    return dld.DescribeLogDirsResult(
        error_code=ErrorCode.NONE, log_dir=path, total_bytes=total, usable_bytes=usable, is_cordoned=False,
        topics=[dld.DescribeLogDirsTopic(name=t, partitions=ps) for t, ps in by_topic.items()])


async def handle_describe_log_dirs(ctx: RequestContext,
                                   request: dld.DescribeLogDirsRequest) -> dld.DescribeLogDirsResponse:
    wanted = None if request.topics is None else {(t.topic, p) for t in request.topics for p in t.partitions}
    results = [_describe_dir(ctx, d, wanted) for d in ctx.log_dirs.log_dirs]
    return dld.DescribeLogDirsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE, results=results)


# ------------------------------------------------------------------------------------------ AlterReplicaLogDirs
async def handle_alter_replica_log_dirs(ctx: RequestContext, request: arld.AlterReplicaLogDirsRequest
                                       ) -> arld.AlterReplicaLogDirsResponse:
    wanted: dict[tuple[str, int], str] = {}
    for d in request.dirs:
        for t in d.topics:
            for p in t.partitions:
                wanted[(t.name, p)] = d.path
    now = ctx.clock()
    by_topic: dict[str, list[arld.AlterReplicaLogDirPartitionResult]] = {}
    for (topic, p), path in wanted.items():
        try:
            ctx.log_dirs.alter_replica_log_dir(topic, p, path, now)
            code = ErrorCode.NONE
        except StorageError as e:
            log.warning("Unable to alter log dirs for %s-%d: %s", topic, p, e)
            code = for_code(e.error_code)
        except OSError as e:
            log.warning("Unable to alter log dirs for %s-%d: %s", topic, p, e)
            code = ErrorCode.KAFKA_STORAGE_ERROR
        by_topic.setdefault(topic, []).append(arld.AlterReplicaLogDirPartitionResult(partition_index=p,
                                                                                    error_code=code))
    return arld.AlterReplicaLogDirsResponse(throttle_time_ms=0, results=[
        arld.AlterReplicaLogDirTopicResult(topic_name=t, partitions=ps) for t, ps in by_topic.items()])


# ------------------------------------------------------------------------------------------ DeleteRecords
async def handle_delete_records(ctx: RequestContext, request: dr.DeleteRecordsRequest) -> dr.DeleteRecordsResponse:
    now = ctx.clock()
    topics = []
    for t in request.topics:
        partitions = []
        for p in t.partitions:
            try:
                error, low = ErrorCode.NONE, ctx.replica_manager.delete_records(t.name, p.partition_index,
                                                                                p.offset, now)
            except KafkaApiError as e:
                error, low = e.code, -1
            partitions.append(dr.DeleteRecordsPartitionResult(partition_index=p.partition_index,
                                                              low_watermark=low, error_code=error))
        topics.append(dr.DeleteRecordsTopicResult(name=t.name, partitions=partitions))
    return dr.DeleteRecordsResponse(throttle_time_ms=0, topics=topics)


# ------------------------------------------------------------------------------------------ OffsetForLeaderEpoch
def _epoch_end_offset(ctx: RequestContext, topic: str, p: ofle.OffsetForLeaderPartition) -> ofle.EpochEndOffset:
    current = p.current_leader_epoch if ctx.api_version >= 2 else UNDEFINED_EPOCH
    try:
        found = ctx.replica_manager.last_offset_for_leader_epoch(topic, p.partition, current, p.leader_epoch)
    except KafkaApiError as e:
        return ofle.EpochEndOffset(error_code=e.code, partition=p.partition)
    epoch, end = found if found is not None else (UNDEFINED_EPOCH, -1)
    return ofle.EpochEndOffset(error_code=ErrorCode.NONE, partition=p.partition, leader_epoch=epoch, end_offset=end)


async def handle_offset_for_leader_epoch(ctx: RequestContext, request: ofle.OffsetForLeaderEpochRequest
                                         ) -> ofle.OffsetForLeaderEpochResponse:
    topics = [ofle.OffsetForLeaderTopicResult(topic=t.topic, partitions=[_epoch_end_offset(ctx, t.topic, p)
                                                                         for p in t.partitions])
              for t in request.topics]
    return ofle.OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)
