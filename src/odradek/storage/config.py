"""Per-log and log-manager settings, with Kafka's names and defaults.

`LogConfig` holds the topic-level settings a partition log obeys; `LogConfig.from_properties` reads the
topic-level names (`segment.bytes`, `retention.ms`, ...). `LogManagerConfig` holds the broker-wide
intervals of the periodic tasks. Broker keys, their synonyms and precedence (`log.retention.hours` and
friends) belong to `odradek.server.config`, which resolves a topic's effective values and hands them
here by their topic-level names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1

# Topic-level name -> LogConfig field.
_TOPIC_KEYS = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "flush.messages": "flush_messages",
    "flush.ms": "flush_ms",
    "file.delete.delay.ms": "file_delete_delay_ms",
}

# Broker-level name -> (LogConfig field, multiplier to the field's unit). Earlier names win, as in Kafka
# (log.roll.ms over log.roll.hours, log.retention.ms over .minutes over .hours).
@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3_600_000
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_ms: int = 7 * 24 * 3_600_000  # -1: no time limit
    retention_bytes: int = -1  # -1: no size limit
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    file_delete_delay_ms: int = 60_000
    cleanup_policy: tuple[str, ...] = ("delete",)

    def __post_init__(self) -> None:
        # Positions in .index entries are int32, so a segment must stay below 2 GiB.
        _check(14 <= self.segment_bytes <= INT_MAX, "segment.bytes", self.segment_bytes)
        _check(self.segment_ms >= 1, "segment.ms", self.segment_ms)
        _check(self.segment_index_bytes >= 12, "segment.index.bytes", self.segment_index_bytes)
        _check(self.index_interval_bytes >= 0, "index.interval.bytes", self.index_interval_bytes)
        _check(self.retention_ms >= -1, "retention.ms", self.retention_ms)
        _check(self.retention_bytes >= -1, "retention.bytes", self.retention_bytes)
        _check(self.flush_messages >= 1, "flush.messages", self.flush_messages)
        _check(self.flush_ms >= 0, "flush.ms", self.flush_ms)
        _check(self.file_delete_delay_ms >= 0, "file.delete.delay.ms", self.file_delete_delay_ms)
        for policy in self.cleanup_policy:
            _check(policy in ("delete", "compact"), "cleanup.policy", self.cleanup_policy)

    @property
    def deletes_by_retention(self) -> bool:
        return "delete" in self.cleanup_policy

    def from_properties(self, props: Mapping[str, str]) -> LogConfig:
        """This config overridden by topic-level properties (`segment.bytes`, `retention.ms`, ...)."""
        changes: dict[str, object] = {}
        for key, name in _TOPIC_KEYS.items():
            if key in props:
                changes[name] = int(props[key])
        if "cleanup.policy" in props:
            changes["cleanup_policy"] = _policy(props["cleanup.policy"])
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class LogManagerConfig:
    log_dirs: tuple[str, ...] = ("/tmp/kafka-logs",)
    retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms
    recovery_point_checkpoint_interval_ms: int = 60_000  # log.flush.offset.checkpoint.interval.ms
    log_start_offset_checkpoint_interval_ms: int = 60_000  # log.flush.start.offset.checkpoint.interval.ms
    high_watermark_checkpoint_interval_ms: int = 5_000  # replica.high.watermark.checkpoint.interval.ms
    log_defaults: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        _check(len(self.log_dirs) >= 1, "log.dirs", self.log_dirs)
        for name in ("retention_check_interval_ms",
                     "recovery_point_checkpoint_interval_ms",
                     "log_start_offset_checkpoint_interval_ms",
                     "high_watermark_checkpoint_interval_ms"):
            _check(getattr(self, name) >= 1, name, getattr(self, name))


def _policy(value: str) -> tuple[str, ...]:
    return tuple(sorted(p.strip() for p in value.split(",") if p.strip()))


def _check(ok: bool, name: str, value: object) -> None:
    if not ok:
        raise ValueError(f"invalid value {value!r} for {name}")
