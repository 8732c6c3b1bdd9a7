"""Retention: which old segments of a log to delete, by time, by size and below the log start offset.

Kafka's rules, applied to a prefix of the segments (oldest first), stopping at the first segment that
does not qualify:
- `retention.ms` (>= 0): a segment whose largest timestamp is more than retention.ms before now
  (a segment without timestamps uses its file's modification time);
- `retention.bytes` (>= 0, per partition): oldest segments while the log would still be larger than
  retention.bytes without them;
- log start offset: a segment whose records all lie below log_start_offset (after DeleteRecords).
Time and size apply only with cleanup.policy containing "delete". A segment is deleted only if all
its records are below the high watermark, and the active segment is never deleted (the log is never
left without one; Kafka would roll an expired active segment first, odradek waits for the next roll).
Deleting moves the log start offset to the first remaining segment; files are renamed `.deleted`
and removed after file.delete.delay.ms (Log.delete_expired_files).
"""

from __future__ import annotations

from odradek.storage.log import Log
from odradek.storage.segment import LogSegment


def deletable_segment_count(log: Log, now_ms: int) -> int:
    """How many of the oldest segments retention would delete now."""
    segments = log.segments
    config = log.config
    candidates = 0
    for i, segment in enumerate(segments[:-1]):
        if segments[i + 1].base_offset > log.high_watermark:
            break
        candidates = i + 1
    by_start = sum(1 for i in range(candidates)
                   if segments[i + 1].base_offset <= log.log_start_offset)
    by_time = by_size = 0
    if config.deletes_by_retention and config.retention_ms >= 0:
        for segment in segments[:candidates]:
            if now_ms - _largest_timestamp(segment) <= config.retention_ms:
                break
            by_time += 1
    if config.deletes_by_retention and config.retention_bytes >= 0:
        excess = log.size_bytes - config.retention_bytes
        for segment in segments[:candidates]:
            if excess - segment.size < 0:
                break
            excess -= segment.size
            by_size += 1
    return max(by_start, by_time, by_size)


def apply_retention(log: Log, now_ms: int) -> int:
    """Delete the segments retention allows; return how many were deleted."""
    return log.delete_oldest_segments(deletable_segment_count(log, now_ms), now_ms)


def _largest_timestamp(segment: LogSegment) -> int:
    if segment.max_timestamp >= 0:
        return segment.max_timestamp
    return int(segment.log_path.stat().st_mtime * 1000)
