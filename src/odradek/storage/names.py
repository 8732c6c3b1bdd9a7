"""Partition directory names: `<topic>-<partition>`, as Kafka lays out a log dir.

A topic name is 1-249 characters from [a-zA-Z0-9._-] and neither "." nor ".." (Kafka's rule), which
also makes it a safe single path component. The partition is a non-negative decimal integer after the
last "-" (topic names may contain "-").
"""

from __future__ import annotations

import re

from odradek.storage.errors import InvalidTopicError

_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


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
