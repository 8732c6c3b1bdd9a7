"""Per-log, log-manager and log-cleaner settings, with Kafka's names and defaults.

`LogConfig` holds the topic-level settings a partition log obeys; `LogConfig.from_properties` reads the
topic-level names (`segment.bytes`, `retention.ms`, `min.cleanable.dirty.ratio`, ...).
`LogManagerConfig` holds the broker-wide intervals of the periodic tasks, the `CleanerConfig`
(the `log.cleaner.*` keys, which have no topic-level form) and the throttle of replica moves between
log dirs. Broker keys, their synonyms and
precedence (`log.retention.hours` and friends) belong to `odradek.server.config`, which resolves a
topic's effective values and hands them here by their topic-level names.

`LOG_CONFIG_BOUNDS` is the one statement of what a log accepts: Kafka's range of each topic-level key
(its type's range narrowed by its LogConfig validator). The server's config definitions take their
validators of these keys from it, and check at import that they accept nothing it refuses, so a value
AlterConfigs or CreateTopics accepts always builds a `LogConfig`. Kafka's meanings hold at the
boundaries: any negative `retention.bytes` is no size limit, `retention.ms` -1 no time limit, and a
`segment.index.bytes` below one entry still holds one entry (the segment rolls when it is full).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
MIN_DEDUPE_BUFFER_SIZE = 64 * 1024  # room for a few hundred keys: a cleaning pass must make progress

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
    "delete.retention.ms": "delete_retention_ms",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
}
_TOPIC_FLOAT_KEYS = {"min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio"}

# Topic-level name -> (least, greatest) value a log accepts: Kafka's LogConfig definitions.
LOG_CONFIG_BOUNDS: dict[str, tuple[int | float, int | float]] = {
    # Kafka's topic minimum is 1 MiB (4.0); a log itself needs room for one batch header, and int32
    # positions in .index entries keep a segment below 2 GiB.
    "segment.bytes": (14, INT_MAX),
    "segment.ms": (1, LONG_MAX),
    "segment.index.bytes": (4, INT_MAX),           # below 12 (a time index entry): one entry
    "index.interval.bytes": (0, INT_MAX),
    "retention.ms": (-1, LONG_MAX),                # -1: no time limit
    "retention.bytes": (LONG_MIN, LONG_MAX),       # any negative: no size limit (Kafka: no validator)
    "flush.messages": (1, LONG_MAX),
    "flush.ms": (0, LONG_MAX),
    "file.delete.delay.ms": (0, LONG_MAX),
    "delete.retention.ms": (0, LONG_MAX),
    "min.compaction.lag.ms": (0, LONG_MAX),
    "max.compaction.lag.ms": (1, LONG_MAX),
    "min.cleanable.dirty.ratio": (0.0, 1.0),
}
CLEANUP_POLICIES = ("compact", "delete")
_FIELDS = {**_TOPIC_KEYS, **_TOPIC_FLOAT_KEYS}
assert set(_FIELDS) == set(LOG_CONFIG_BOUNDS)


class LogConfigError(ValueError):
    """A value a log cannot take, by its topic-level name."""

    def __init__(self, name: str, value: object, reason: str) -> None:
        self.name = name
        self.value = value
        self.reason = reason
        super().__init__(f"invalid value {value!r} for {name}: {reason}")


def check_log_value(name: str, value: object) -> str | None:
    """Why a log cannot take `value` for the topic-level key `name`, or None when it can."""
    if name == "cleanup.policy":
        bad = [p for p in value if p not in CLEANUP_POLICIES] if isinstance(value, tuple) else [value]
        return f"String must be one of: {', '.join(CLEANUP_POLICIES)}" if bad else None
    low, high = LOG_CONFIG_BOUNDS[name]
    number = (int, float) if isinstance(low, float) else int
    if not isinstance(value, number) or isinstance(value, bool) or value != value:
        return "Not a number" if isinstance(low, float) else "Not an integer"
    if value < low:
        return f"Value must be at least {low}"
    if value > high:
        return f"Value must be no more than {high}"
    return None


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
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    min_cleanable_dirty_ratio: float = 0.5

    def __post_init__(self) -> None:
        for key, name in _FIELDS.items():
            value = getattr(self, name)
            reason = check_log_value(key, value)
            if reason is not None:
                raise LogConfigError(key, value, reason)
        reason = check_log_value("cleanup.policy", self.cleanup_policy)
        if reason is not None:
            raise LogConfigError("cleanup.policy", ",".join(self.cleanup_policy), reason)

    @property
    def deletes_by_retention(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """The age at which the active segment rolls: `segment.ms`, or `max.compaction.lag.ms` when
        that is shorter on a compacted topic (the cleaner never touches the active segment, so a
        record could otherwise wait for compaction longer than the lag allows; Kafka does the same)."""
        if self.compact:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms

    def from_properties(self, props: Mapping[str, str]) -> LogConfig:
        """This config overridden by topic-level properties (`segment.bytes`, `retention.ms`, ...).
        Raises LogConfigError, naming the key, for a value a log cannot take."""
        changes: dict[str, Any] = {}
        for keys, kind in ((_TOPIC_KEYS, int), (_TOPIC_FLOAT_KEYS, float)):
            for key, name in keys.items():
                if key in props:
                    try:
                        changes[name] = kind(props[key])
                    except ValueError:
                        raise LogConfigError(key, props[key], f"Not a number of type {kind.__name__}") from None
        if "cleanup.policy" in props:
            changes["cleanup_policy"] = _policy(props["cleanup.policy"])
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    """The log cleaner's broker-wide settings (Kafka's `log.cleaner.*` keys and defaults)."""

    enable: bool = True                             # log.cleaner.enable
    threads: int = 1                                # log.cleaner.threads
    dedupe_buffer_size: int = 128 * 1024 * 1024     # log.cleaner.dedupe.buffer.size, all threads
    io_buffer_size: int = 512 * 1024                # log.cleaner.io.buffer.size, per thread
    io_buffer_load_factor: float = 0.9              # log.cleaner.io.buffer.load.factor
    backoff_ms: int = 15_000                        # log.cleaner.backoff.ms
    io_max_bytes_per_second: float = 1.7976931348623157e308  # log.cleaner.io.max.bytes.per.second

    def __post_init__(self) -> None:
        _check(self.threads >= 0, "log.cleaner.threads", self.threads)
        _check(self.dedupe_buffer_size >= MIN_DEDUPE_BUFFER_SIZE, "log.cleaner.dedupe.buffer.size",
               self.dedupe_buffer_size)
        _check(self.io_buffer_size >= 4096, "log.cleaner.io.buffer.size", self.io_buffer_size)
        _check(0 < self.io_buffer_load_factor <= 1, "log.cleaner.io.buffer.load.factor",
               self.io_buffer_load_factor)
        _check(self.backoff_ms >= 0, "log.cleaner.backoff.ms", self.backoff_ms)
        _check(self.io_max_bytes_per_second > 0, "log.cleaner.io.max.bytes.per.second",
               self.io_max_bytes_per_second)

    @property
    def running_threads(self) -> int:
        return self.threads if self.enable else 0


@dataclass(frozen=True, slots=True)
class LogManagerConfig:
    log_dirs: tuple[str, ...] = ("/tmp/kafka-logs",)
    retention_check_interval_ms: int = 300_000  # log.retention.check.interval.ms
    recovery_point_checkpoint_interval_ms: int = 60_000  # log.flush.offset.checkpoint.interval.ms
    log_start_offset_checkpoint_interval_ms: int = 60_000  # log.flush.start.offset.checkpoint.interval.ms
    high_watermark_checkpoint_interval_ms: int = 5_000  # replica.high.watermark.checkpoint.interval.ms
    log_defaults: LogConfig = field(default_factory=LogConfig)
    cleaner: CleanerConfig = field(default_factory=CleanerConfig)
    # replica moves between log dirs: replica.alter.log.dirs.io.max.bytes.per.second (dynamic; Long.MAX: none),
    # measured over alter.log.dirs.replication.quota.window.num windows of ...window.size.seconds
    move_max_bytes_per_second: int = LONG_MAX
    move_quota_window_num: int = 11
    move_quota_window_size_seconds: int = 1
    # log.drop.behind.bytes once resolved (page_cache.resolve_keep_bytes): the newest bytes of each log
    # kept in the page cache; 0: the kernel decides, as in Kafka
    drop_behind_bytes: int = 0

    def __post_init__(self) -> None:
        _check(len(self.log_dirs) >= 1, "log.dirs", self.log_dirs)
        _check(self.drop_behind_bytes >= 0, "log.drop.behind.bytes", self.drop_behind_bytes)
        _check(self.move_max_bytes_per_second >= 0, "replica.alter.log.dirs.io.max.bytes.per.second",
               self.move_max_bytes_per_second)
        _check(self.move_quota_window_num >= 1, "alter.log.dirs.replication.quota.window.num",
               self.move_quota_window_num)
        _check(self.move_quota_window_size_seconds >= 1, "alter.log.dirs.replication.quota.window.size.seconds",
               self.move_quota_window_size_seconds)
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
