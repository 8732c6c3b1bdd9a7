"""Partition directory names: `<topic>-<partition>`, as Kafka lays out a log dir, and
`<topic>-<partition>.<uuid>-future` for a replica being moved to this log dir (AlterReplicaLogDirs).

A topic name is 1-249 characters from [a-zA-Z0-9._-] and neither "." nor ".." (Kafka's rule), which
also makes it a safe single path component. The partition is a non-negative decimal integer after the
last "-" (topic names may contain "-").
"""

from __future__ import annotations

import re
import uuid

from odradek.storage.errors import InvalidTopicError

_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
FUTURE_DIR_SUFFIX = "-future"
MAX_DIR_NAME_BYTES = 255
_FUTURE = re.compile(r"^(.+)\.[0-9a-f]{32}" + FUTURE_DIR_SUFFIX + "$")


def future_dir_name(topic: str, partition: int) -> str:
    """Kafka's UnifiedLog.logFutureDirName: `<topic>-<partition>.<uuid>-future`; it may be longer than
    a file name allows (`MAX_DIR_NAME_BYTES`), which the caller checks."""
    return f"{partition_dir_name(topic, partition)}.{uuid.uuid4().hex}{FUTURE_DIR_SUFFIX}"


def is_future_dir_name(name: str) -> bool:
    return _FUTURE.match(name) is not None


def parse_log_dir_name(name: str) -> tuple[str, int]:
    """(topic, partition) of a partition directory, current or future."""
    m = _FUTURE.match(name)
    return parse_partition_dir_name(m.group(1) if m else name)


def partition_dir_name(topic: str, partition: int) -> str:
    validate_topic(topic)
    if partition < 0:
        raise ValueError(f"partition {partition}")
    return f"{topic}-{partition}"


def parse_partition_dir_name(name: str) -> tuple[str, int]:
    topic, sep, partition = name.rpartition("-")
    if not sep or not partition.isdigit():
        raise InvalidTopicError(f"{name!r} is not <topic>-<partition>")
    validate_topic(topic)
    return topic, int(partition)


def validate_topic(topic: str) -> None:
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise InvalidTopicError(f"invalid topic name {topic!r}")
