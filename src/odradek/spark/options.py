"""The data source's options, parsed and checked: the names and rules of Spark's built-in Kafka source
and sink (Structured Streaming + Kafka Integration Guide), which are facts to follow here. Pure.

Spark hands options over case-insensitively (keys lower-cased); values keep their case. Every
`kafka.<name>` option is passed to the client as `<name>`; the client rejects names it does not know
(DESIGN: unknown keys are reported, never ignored). As in Spark, a few Kafka consumer settings are
refused because the source owns them (offsets, deserialization, auto commit).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping

EARLIEST = -2
LATEST = -1

# Kafka consumer settings Spark's source refuses, and why (messages after Spark's).
_REFUSED = {
    "auto.offset.reset": "set the source option 'startingOffsets' to 'earliest' or 'latest' instead",
    "key.deserializer": "keys are always read as bytes; deserialize them with DataFrame operations",
    "value.deserializer": "values are always read as bytes; deserialize them with DataFrame operations",
    "enable.auto.commit": "the source does not commit offsets through the consumer; see "
                          "'commitOffsetsToGroup'",
    "interceptor.classes": "consumer interceptors are not supported",
    "key.serializer": "keys are always written as bytes; serialize them with DataFrame operations",
    "value.serializer": "values are always written as bytes; serialize them with DataFrame operations",
}

# Client settings the reader uses unless the user sets them (kafka.<name>).
READER_DEFAULTS = {
    "client.id": "odradek-spark",
    "max.partition.fetch.bytes": 8 << 20,   # whole batches, fewer round trips (profiled)
    "fetch.max.bytes": 64 << 20,
    "receive.message.max.bytes": 128 << 20,
    "allow.auto.create.topics": False,
}
WRITER_DEFAULTS = {
    "client.id": "odradek-spark-writer",
    "linger.ms": 5,
    "batch.size": 1 << 20,
    "buffer.memory": 64 << 20,
    "max.request.size": 8 << 20,
}


# The exactly-once sink's tasks leave their transactions open until the driver commits the batch, after
# the slowest task: Kafka's producer default (60 s) is too short for that; 15 minutes is the broker's
# default transaction.max.timeout.ms. kafka.transaction.timeout.ms overrides it.
EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS = 900_000


class OptionError(ValueError):
    """An option is missing, unknown in its place, or has a wrong value."""


@dataclass(frozen=True)
class Subscription:
    """Exactly one of Spark's `subscribe`, `subscribePattern` and `assign`."""
    kind: str                                   # "subscribe" | "subscribePattern" | "assign"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None    # Java's Matcher.matches()
        return any(t == topic for t, _ in self.assigned)

    def partitions(self, partitions_by_topic: Mapping[str, int]) -> list[tuple[str, int]]:
        """The subscribed topic-partitions among those that exist (name -> partition count)."""
        if self.kind == "assign":
            return sorted(self.assigned)
        out = []
        for topic, count in partitions_by_topic.items():
            internal = topic.startswith("__") and self.kind == "subscribePattern"   # exclude.internal.topics
            if self.matches(topic) and not internal:
                out.extend((topic, p) for p in range(count))
        return sorted(out)


@dataclass(frozen=True)
class OffsetSpec:
    """Where to start or end: `earliest`, `latest`, per-partition offsets (-2 earliest, -1 latest),
    one timestamp for every partition, or per-partition timestamps."""
    kind: str                                         # earliest | latest | offsets | timestamp | timestamps
    offsets: tuple[tuple[tuple[str, int], int], ...] = ()
    timestamp: int | None = None

    def as_dict(self) -> dict[tuple[str, int], int]:
        return dict(self.offsets)


@dataclass(frozen=True)
class ReadOptions:
    client: dict
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    starting_timestamp_strategy: str = "error"        # startingOffsetsByTimestampStrategy
    poll_timeout_ms: int = 120_000                    # kafkaConsumer.pollTimeoutMs
    commit_group: str | None = None                   # commitOffsetsToGroup


@dataclass(frozen=True)
class WriteOptions:
    client: dict
    topic: str | None = None
    exactly_once: bool = False            # exactlyOnce=true, or kafka.transactional.id given
    transactional_id: str | None = None   # the prefix of the tasks' transactional ids (kafka.transactional.id)


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): v for k, v in dict(options).items()}


def client_config(opts: Mapping[str, str], defaults: Mapping, role: str = "consumer") -> dict:
    """`kafka.<name>` options as client config, over `defaults`; refused names raise OptionError."""
    out = dict(defaults)
    for key, value in opts.items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka."):]
        if name in _REFUSED:
            raise OptionError(f"Kafka option '{name}' is not supported: {_REFUSED[name]}")
        out[name] = value
    if "bootstrap.servers" not in out:
        raise OptionError(f"Option 'kafka.bootstrap.servers' must be specified for configuring Kafka {role}")
    return out


def _positive(opts: dict, name: str) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"Invalid value '{raw}' for option '{name}', must be a positive integer") from None
    if value <= 0:
        raise OptionError(f"Invalid value '{raw}' for option '{name}', must be a positive integer")
    return value


def _bool(opts: dict, name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    s = str(raw).strip().lower()
    if s not in ("true", "false"):
        raise OptionError(f"Option '{name}' must be 'true' or 'false', not '{raw}'")
    return s == "true"


def parse_duration_ms(text: str) -> int:
    """Spark's time strings (`JavaUtils.timeStringAsMs`): '15m', '10s', '100ms', '2h', '1d'; no unit: ms."""
    m = re.fullmatch(r"\s*(-?\d+)\s*(us|ms|s|m|min|h|d)?\s*", str(text).lower())
    if not m:
        raise OptionError(f"Invalid time string '{text}' (use e.g. 100ms, 10s, 15m, 1h)")
    n = int(m.group(1))
    unit = m.group(2) or "ms"
    factor = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
    return int(n * factor[unit])


def parse_subscription(opts: dict) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k) is not None]
    if len(given) != 1:
        raise OptionError("Exactly one of the options 'subscribe', 'subscribePattern' and 'assign' must be "
                          f"specified for the source (got {len(given)})")
    kind = given[0]
    raw = opts[kind]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError(f"No topics to subscribe to as specified value for option 'subscribe' is '{raw}'")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribepattern":
        if not raw.strip():
            raise OptionError("Pattern to subscribe is empty as specified value for option 'subscribePattern'")
        try:
            re.compile(raw)
        except re.error as e:
            raise OptionError(f"Invalid subscribePattern '{raw}': {e}") from None
        return Subscription("subscribePattern", pattern=raw)
    try:
        parsed = json.loads(raw)
        assigned = tuple(sorted((str(t), int(p)) for t, ps in parsed.items() for p in ps))
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"Invalid value '{raw}' for option 'assign': use JSON like "
                          "{\"topicA\":[0,1],\"topicB\":[2,4]}") from None
    if not assigned:
        raise OptionError(f"No topic-partitions to assign as specified value for option 'assign' is '{raw}'")
    return Subscription("assign", assigned=assigned)


def _offsets_json(raw: str, name: str) -> tuple[tuple[tuple[str, int], int], ...]:
    try:
        parsed = json.loads(raw)
        return tuple(sorted(((str(t), int(p)), int(o)) for t, ps in parsed.items() for p, o in ps.items()))
    except (ValueError, AttributeError, TypeError):
        raise OptionError(f"Invalid value '{raw}' for option '{name}': use 'earliest', 'latest' or JSON like "
                          "{\"topicA\":{\"0\":23,\"1\":-1},\"topicB\":{\"0\":-2}}") from None


def parse_offset_spec(opts: dict, side: str, default: str) -> OffsetSpec:
    """`side` is 'starting' or 'ending'. Precedence as in Spark: <side>Timestamp, then
    <side>OffsetsByTimestamp, then <side>Offsets."""
    ts = opts.get(f"{side}timestamp")
    if ts is not None:
        try:
            return OffsetSpec("timestamp", timestamp=int(str(ts).strip()))
        except ValueError:
            raise OptionError(f"Invalid value '{ts}' for option '{side}Timestamp': milliseconds since the "
                              "epoch") from None
    by_ts = opts.get(f"{side}offsetsbytimestamp")
    if by_ts is not None:
        return OffsetSpec("timestamps", offsets=_offsets_json(by_ts, f"{side}OffsetsByTimestamp"))
    raw = opts.get(f"{side}offsets", default)
    s = str(raw).strip().lower()
    if s in ("earliest", "latest"):
        return OffsetSpec(s)
    return OffsetSpec("offsets", offsets=_offsets_json(raw, f"{side}Offsets"))


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    opts = _lower(options)
    client = client_config(opts, READER_DEFAULTS)
    isolation = str(client.get("isolation.level", "read_uncommitted")).lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise OptionError(f"kafka.isolation.level must be read_committed or read_uncommitted, not '{isolation}'")
    client["auto.offset.reset"] = "none"          # the source decides positions; out of range is data loss
    client["enable.auto.commit"] = False          # tasks never commit (a kafka.group.id is only a name)
    sub = parse_subscription(opts)
    starting = parse_offset_spec(opts, "starting", "latest" if streaming else "earliest")
    if streaming:
        for name in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp"):
            if opts.get(name) is not None:
                raise OptionError(f"Option '{name}' is not valid in streaming queries (batch queries only)")
        ending = OffsetSpec("latest")
    else:
        ending = parse_offset_spec(opts, "ending", "latest")
        if starting.kind == "latest" or (starting.kind == "offsets"
                                         and any(o == LATEST for _, o in starting.offsets)):
            raise OptionError("starting offset can't be latest for batch queries on Kafka")
        if ending.kind == "earliest" or (ending.kind == "offsets"
                                         and any(o == EARLIEST for _, o in ending.offsets)):
            raise OptionError("ending offset can't be earliest for batch queries on Kafka")
    for spec, side in ((starting, "starting"), (ending, "ending")):
        if spec.kind == "offsets" and any(o < EARLIEST for _, o in spec.offsets):
            raise OptionError(f"{side} offsets must be >= 0, or -2 (earliest) or -1 (latest)")
    strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError("startingOffsetsByTimestampStrategy must be 'error' or 'latest'")
    delay = opts.get("maxtriggerdelay")
    group = opts.get("commitoffsetstogroup")
    return ReadOptions(
        client=client, subscription=sub, starting=starting, ending=ending,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        min_partitions=_positive(opts, "minPartitions"),
        max_records_per_partition=_positive(opts, "maxRecordsPerPartition"),
        max_offsets_per_trigger=_positive(opts, "maxOffsetsPerTrigger"),
        min_offsets_per_trigger=_positive(opts, "minOffsetsPerTrigger"),
        max_trigger_delay_ms=parse_duration_ms(delay) if delay is not None else 15 * 60 * 1000,
        starting_timestamp_strategy=strategy,
        poll_timeout_ms=_positive(opts, "kafkaConsumer.pollTimeoutMs") or 120_000,
        commit_group=str(group).strip() if group is not None and str(group).strip() else None,
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lower(options)
    client = client_config(opts, WRITER_DEFAULTS, "producer")
    topic = opts.get("topic")
    prefix = client.pop("transactional.id", None)
    prefix = str(prefix).strip() if prefix is not None and str(prefix).strip() else None
    exactly_once = _bool(opts, "exactlyOnce", prefix is not None)
    if prefix is not None and not exactly_once:
        raise OptionError("kafka.transactional.id asks for the exactly-once sink; it cannot go with exactlyOnce=false")
    if exactly_once:
        client.setdefault("transaction.timeout.ms", EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS)
    return WriteOptions(client=client, topic=topic.strip() if topic and topic.strip() else None,
                        exactly_once=exactly_once, transactional_id=prefix)
