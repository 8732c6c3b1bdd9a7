"""Errors raised by the storage layer, each carrying the Kafka error code the broker answers with.

Partition-level failures become per-partition error codes in responses (STYLE, "One module per API
family"); the broker maps an exception to its code with `error_code` and never needs to parse messages.
"""

from __future__ import annotations

KAFKA_STORAGE_ERROR = 56
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
RECORD_LIST_TOO_LARGE = 18
INVALID_TOPIC_EXCEPTION = 17
REPLICA_NOT_AVAILABLE = 9
LOG_DIR_NOT_FOUND = 57
UNKNOWN_SERVER_ERROR = -1


class StorageError(Exception):
    """A disk-level failure or an inconsistent log directory (KAFKA_STORAGE_ERROR)."""

    error_code = KAFKA_STORAGE_ERROR


class OffsetOutOfRangeError(StorageError):
    """A read or a DeleteRecords named an offset outside [log_start_offset, log_end_offset]."""

    error_code = OFFSET_OUT_OF_RANGE

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int, what: str = "") -> None:
        detail = f" ({what})" if what else ""
        super().__init__(
            f"offset {offset} out of range [{log_start_offset}, {log_end_offset}]{detail}")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class RecordListTooLargeError(StorageError):
    """An append larger than `segment.bytes`: it could never fit in one segment."""

    error_code = RECORD_LIST_TOO_LARGE


class CorruptRecordError(StorageError):
    """Bytes on disk (or handed to a follower append) that are not a valid v2 batch."""

    error_code = CORRUPT_MESSAGE

    def __init__(self, message: str, position: int = -1) -> None:
        super().__init__(message)
        self.position = position


class UnexpectedAppendOffsetError(StorageError):
    """A follower append whose first offset is below the log end offset: truncate first."""

    error_code = UNKNOWN_SERVER_ERROR

    def __init__(self, first_offset: int, log_end_offset: int) -> None:
        super().__init__(f"append at offset {first_offset} below log end offset {log_end_offset}")
        self.first_offset = first_offset
        self.log_end_offset = log_end_offset


class InvalidTopicError(StorageError):
    """A topic name that cannot be a directory name (Kafka's legal characters, at most 249)."""

    error_code = INVALID_TOPIC_EXCEPTION


class InconsistentMetaPropertiesError(StorageError):
    """meta.properties disagrees with the configured broker.id or across log dirs (cluster.id)."""


class LogDirNotFoundError(StorageError):
    """A path that is not one of `log.dirs` (Kafka's LogDirNotFoundException, LOG_DIR_NOT_FOUND)."""

    error_code = LOG_DIR_NOT_FOUND


class LogDirOfflineError(StorageError):
    """A log dir that cannot be used (Kafka's KafkaStorageException for an offline dir)."""


class ReplicaNotHostedError(StorageError):
    """No log of the partition here (AlterReplicaLogDirs' REPLICA_NOT_AVAILABLE)."""

    error_code = REPLICA_NOT_AVAILABLE
