"""The partition log on disk: segments, offset and time indexes, checkpoints, recovery, retention,
the log cleaner (compaction), leader-epoch cache (DESIGN, "The broker on disk"). Disk I/O only: no
sockets, no asyncio; the only threads are the log cleaner's, which never call a Log (cleaner.py);
clocks come in as `now_ms` arguments.

The broker uses `LogManager` (all partitions, periodic tasks) and `Log` (one partition); reads return
`FileSlice`s for sendfile. Every error carries its Kafka error code (`errors.py`).
"""

from odradek.storage.checkpoints import MetaProperties, OffsetCheckpointFile
from odradek.storage.cleaner import CleanerStats
from odradek.storage.config import CleanerConfig, LogConfig, LogManagerConfig
from odradek.storage.epoch_cache import LeaderEpochCache
from odradek.storage.errors import CorruptRecordError, InconsistentMetaPropertiesError, \
    InvalidTopicError, OffsetOutOfRangeError, RecordListTooLargeError, StorageError, \
    UnexpectedAppendOffsetError
from odradek.storage.fileslice import FileSlice
from odradek.storage.log import Log, LogAppendInfo, TimestampAndOffset
from odradek.storage.manager import LogManager
from odradek.storage.segment import LogSegment

__all__ = [
    "CleanerConfig", "CleanerStats", "CorruptRecordError", "FileSlice",
    "InconsistentMetaPropertiesError", "InvalidTopicError",
    "LeaderEpochCache", "Log", "LogAppendInfo", "LogConfig", "LogManager", "LogManagerConfig",
    "LogSegment", "MetaProperties", "OffsetCheckpointFile", "OffsetOutOfRangeError",
    "RecordListTooLargeError", "StorageError", "TimestampAndOffset", "UnexpectedAppendOffsetError",
]
