"""Broker and topic configuration, as data: every key Kafka defines that odradek reads or accepts.

Names, types, defaults, valid ranges and importance are Apache Kafka's (4.1 where the key still exists;
the last 3.9 value for keys 4.0 removed but odradek keeps, such as `zookeeper.*` and the legacy
message-format keys, because odradek runs on ZooKeeper and speaks the legacy formats). Where odradek's
default differs from Kafka's, the difference is listed in `ODRADEK_DEFAULTS` or `EMBEDDED_DEFAULTS` with
its reason; the `ConfigKey` itself always carries Kafka's default.

`ConfigType` and `ConfigSource` carry the ids DescribeConfigs (v1+ sources, v3+ types) puts on the wire.
`TOPIC_CONFIG_SYNONYMS` maps each topic config to the broker configs that give its default, in Kafka's
precedence order (`retention.ms` <- `log.retention.ms`, `log.retention.minutes`, `log.retention.hours`).
`BROKER_SYNONYM_GROUPS` are the broker keys that set one value under several names and units.

No logic lives here beyond the small validators and the two listener-format parsers; resolution and
precedence are in `odradek.server.config`.

The topic keys a partition log obeys take their ranges from the storage layer's
`odradek.storage.config.LOG_CONFIG_BOUNDS` (Kafka's LogConfig definitions), and a check at import
proves that no definition here accepts a value the storage layer refuses: a config the admin APIs
accept can always be applied, at once and after a restart (issue 26).
"""

from __future__ import annotations

import enum
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from odradek.storage.config import CLEANUP_POLICIES as LOG_CLEANUP_POLICIES
from odradek.storage.config import LOG_CONFIG_BOUNDS

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
SHORT_MIN = -(2**15)
SHORT_MAX = 2**15 - 1
LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
DOUBLE_MAX = sys.float_info.max

MS_PER_MINUTE = 60_000
MS_PER_HOUR = 3_600_000


class ConfigType(enum.IntEnum):
    """DescribeConfigs v3+ `config_type` ids (Kafka's DescribeConfigsResponse.ConfigType)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(enum.IntEnum):
    """DescribeConfigs v1+ `config_source` ids (Kafka's DescribeConfigsResponse.ConfigSource)."""

    UNKNOWN = 0
    TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    DYNAMIC_BROKER_LOGGER_CONFIG = 6
    CLIENT_METRICS_CONFIG = 7
    GROUP_CONFIG = 8


class Importance(enum.Enum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


HIGH, MEDIUM, LOW = Importance.HIGH, Importance.MEDIUM, Importance.LOW
BOOLEAN, STRING, INT, SHORT = ConfigType.BOOLEAN, ConfigType.STRING, ConfigType.INT, ConfigType.SHORT
LONG, DOUBLE, LIST, CLASS = ConfigType.LONG, ConfigType.DOUBLE, ConfigType.LIST, ConfigType.CLASS
PASSWORD = ConfigType.PASSWORD


class Password:
    """A secret config value: never printed, never returned by DescribeConfigs."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "[hidden]"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Password) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


# ---------------------------------------------------------------------------------------------------
# Validators: `check(value)` returns None when the (already typed) value is fine, else the reason.


@dataclass(frozen=True)
class AtLeast:
    minimum: int | float

    def check(self, value: Any) -> str | None:
        return None if value is None or value >= self.minimum else f"Value must be at least {self.minimum}"

    def __str__(self) -> str:
        return f"[{self.minimum},...]"


@dataclass(frozen=True)
class Between:
    minimum: int | float
    maximum: int | float

    def check(self, value: Any) -> str | None:
        if value is None:
            return None
        if value < self.minimum:
            return f"Value must be at least {self.minimum}"
        if value > self.maximum:
            return f"Value must be no more than {self.maximum}"
        return None

    def __str__(self) -> str:
        return f"[{self.minimum},...,{self.maximum}]"


@dataclass(frozen=True)
class OneOf:
    """A string from a fixed set; case-sensitive, like Kafka's ValidString."""

    choices: tuple[str, ...]

    def check(self, value: Any) -> str | None:
        if value is None or value in self.choices:
            return None
        return f"String must be one of: {', '.join(self.choices)}"

    def __str__(self) -> str:
        return f"[{', '.join(self.choices)}]"


@dataclass(frozen=True)
class ListOf:
    """A list whose every element is from a fixed set, like Kafka's ValidList."""

    choices: tuple[str, ...]

    def check(self, value: Any) -> str | None:
        bad = [item for item in value or () if item not in self.choices]
        return f"String must be one of: {', '.join(self.choices)}" if bad else None

    def __str__(self) -> str:
        return f"[{', '.join(self.choices)}]"


@dataclass(frozen=True)
class Predicate:
    """A check written as a function returning the reason or None, with a description for docs."""

    function: Callable[[Any], str | None]
    description: str

    def check(self, value: Any) -> str | None:
        return None if value is None else self.function(value)

    def __str__(self) -> str:
        return self.description


Validator = AtLeast | Between | OneOf | ListOf | Predicate


# ---------------------------------------------------------------------------------------------------
# Listener formats, needed by validators here and by BrokerConfig.

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_LISTENER = re.compile(r"^([A-Za-z0-9_-]+)://(\[[0-9A-Fa-f:.]+\]|[^:/\[\]]*):(-?\d+)$")


@dataclass(frozen=True)
class Endpoint:
    """One listener: `NAME://host:port`. An empty host binds every interface."""

    listener_name: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.listener_name}://{host}:{self.port}"


def parse_listeners(value: str | None) -> list[Endpoint]:
    """Parse `listeners` / `advertised.listeners`; raises ValueError with Kafka-like reasons."""
    endpoints: list[Endpoint] = []
    if not value or not value.strip():
        return endpoints
    for item in (part.strip() for part in value.split(",")):
        match = _LISTENER.match(item)
        if match is None:
            raise ValueError(f"Unable to parse {item} to a broker endpoint")
        name, host, port_text = match.groups()
        port = int(port_text)
        if not 0 <= port <= 65535:
            raise ValueError(f"Invalid port {port} in {item}")
        endpoints.append(Endpoint(name.upper(), host.strip("[]"), port))
    names = [endpoint.listener_name for endpoint in endpoints]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"Each listener must have a different name, listeners: {value}")
    return endpoints


def parse_protocol_map(value: str | None) -> dict[str, str]:
    """Parse `listener.security.protocol.map` (`NAME:PROTOCOL,...`)."""
    mapping: dict[str, str] = {}
    if not value or not value.strip():
        return mapping
    for item in (part.strip() for part in value.split(",")):
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"Invalid listener security protocol map entry {item!r}: "
                             f"expected NAME:PROTOCOL with PROTOCOL one of {', '.join(SECURITY_PROTOCOLS)}")
        mapping[name] = protocol
    return mapping


def _check_listeners(value: str) -> str | None:
    try:
        parse_listeners(value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_protocol_map(value: str) -> str | None:
    try:
        parse_protocol_map(value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_ip_overrides(value: str) -> str | None:
    for item in filter(None, (part.strip() for part in value.split(","))):
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.isdigit():
            return f"Invalid entry {item!r}: expected hostName:count"
    return None


def _check_throttled_replicas(value: list[str]) -> str | None:
    if value == ["*"]:
        return None
    for item in value:
        partition, sep, broker = item.strip().partition(":")
        if not sep or not partition.isdigit() or not broker.isdigit():
            return ("must be the literal '*' or a list of replicas in the following format: "
                    "[partitionId]:[brokerId],[partitionId]:[brokerId],...")
    return None


def _check_gzip_level(value: int) -> str | None:
    return None if value == -1 or 1 <= value <= 9 else "Value must be -1 (default) or between 1 and 9"


LISTENERS = Predicate(_check_listeners, "NAME://host:port,...")
PROTOCOL_MAP = Predicate(_check_protocol_map, "NAME:PROTOCOL,...")
IP_OVERRIDES = Predicate(_check_ip_overrides, "hostName:count,...")
THROTTLED_REPLICAS = Predicate(_check_throttled_replicas, "[partitionId]:[brokerId],... or *")
GZIP_LEVEL = Predicate(_check_gzip_level, "[-1, 1,...,9]")
COMPRESSION_TYPES = OneOf(("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"))
TIMESTAMP_TYPES = OneOf(("CreateTime", "LogAppendTime"))
CLEANUP_POLICIES = ListOf(LOG_CLEANUP_POLICIES)


def log_range(name: str) -> Validator | None:
    """The validator of a topic-level log key: the storage layer's range, as Kafka's ConfigDef states it
    (none when the range is the whole of the type's, as for `retention.bytes`)."""
    low, high = LOG_CONFIG_BOUNDS[name]
    if isinstance(low, float):
        return Between(low, high)
    if low <= LONG_MIN:
        return None
    return AtLeast(low) if high >= INT_MAX else Between(low, high)


# ---------------------------------------------------------------------------------------------------
# Definitions


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: ConfigType
    default: Any  # typed (int, bool, str, float, tuple of str for LIST) or None for "no value"
    importance: Importance
    validator: Validator | None = None
    doc: str = ""
    dynamic: bool = False  # broker keys only: updatable with AlterConfigs (else read-only, as in Kafka)
    removed_in: str | None = None  # the Kafka version that removed it; odradek still accepts it

    @property
    def sensitive(self) -> bool:
        return self.type is ConfigType.PASSWORD


def _defs(*keys: ConfigKey) -> dict[str, ConfigKey]:
    table: dict[str, ConfigKey] = {}
    for key in keys:
        assert key.name not in table, f"duplicate config definition {key.name}"
        table[key.name] = key
    return table


K = ConfigKey
_DEFAULT_PROTOCOL_MAP = "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"

BROKER_CONFIGS: dict[str, ConfigKey] = _defs(
    # --- identity and cluster
    K("broker.id", INT, -1, HIGH, None, "This broker's id; -1 lets the ZooKeeper cluster generate one."),
    K("node.id", INT, -1, HIGH, None, "KRaft name for the broker id; if set it must equal broker.id."),
    K("broker.id.generation.enable", BOOLEAN, True, MEDIUM, None, "Generate a broker id when none is set."),
    K("reserved.broker.max.id", INT, 1000, MEDIUM, AtLeast(0), "Highest id a configured broker.id may use."),
    K("broker.rack", STRING, None, MEDIUM, None, "Rack of the broker, for rack-aware replica assignment."),
    K("process.roles", LIST, (), HIGH, ListOf(("broker", "controller")), "KRaft roles; accepted, not used."),
    K("controller.quorum.voters", LIST, (), HIGH, None, "KRaft voters; accepted, not used."),
    K("controller.quorum.bootstrap.servers", LIST, (), HIGH, None, "KRaft bootstrap; accepted, not used."),
    K("controller.listener.names", STRING, None, HIGH, None, "KRaft controller listeners; accepted, not used."),
    # --- ZooKeeper (removed in Kafka 4.0; odradek's multi-broker mode uses it)
    K("zookeeper.connect", STRING, None, HIGH, None, "host:port[,host:port...][/chroot] of the ZooKeeper "
      "ensemble; unset means embedded metadata.", removed_in="4.0"),
    K("zookeeper.session.timeout.ms", INT, 18000, HIGH, None, "ZooKeeper session timeout.", removed_in="4.0"),
    K("zookeeper.connection.timeout.ms", INT, None, HIGH, None, "Connect timeout; unset means "
      "zookeeper.session.timeout.ms.", removed_in="4.0"),
    K("zookeeper.set.acl", BOOLEAN, False, HIGH, None, "Use secure ZooKeeper ACLs.", removed_in="4.0"),
    K("zookeeper.max.in.flight.requests", INT, 10, HIGH, AtLeast(1), "Unacknowledged requests to ZooKeeper "
      "before blocking.", removed_in="4.0"),
    K("zookeeper.ssl.client.enable", BOOLEAN, False, MEDIUM, None, "TLS to ZooKeeper.", removed_in="4.0"),
    K("zookeeper.ssl.keystore.location", STRING, None, MEDIUM, None, "", removed_in="4.0"),
    K("zookeeper.ssl.keystore.password", PASSWORD, None, MEDIUM, None, "", removed_in="4.0"),
    K("zookeeper.ssl.truststore.location", STRING, None, MEDIUM, None, "", removed_in="4.0"),
    K("zookeeper.ssl.truststore.password", PASSWORD, None, MEDIUM, None, "", removed_in="4.0"),
    K("inter.broker.protocol.version", STRING, "3.9-IV0", MEDIUM, None, "Inter-broker protocol version.",
      removed_in="4.0"),
    # --- listeners and sockets
    K("listeners", STRING, "PLAINTEXT://:9092", HIGH, LISTENERS, "Addresses to listen on, NAME://host:port.",
      dynamic=True),
    K("advertised.listeners", STRING, None, HIGH, LISTENERS, "Addresses given to clients; default listeners.",
      dynamic=True),
    K("listener.security.protocol.map", STRING, _DEFAULT_PROTOCOL_MAP, LOW, PROTOCOL_MAP,
      "Listener name to security protocol.", dynamic=True),
    K("inter.broker.listener.name", STRING, None, MEDIUM, None, "Listener brokers use to talk to each other."),
    K("security.inter.broker.protocol", STRING, "PLAINTEXT", MEDIUM, OneOf(SECURITY_PROTOCOLS),
      "Protocol brokers use to talk to each other."),
    K("socket.send.buffer.bytes", INT, 102400, HIGH, None, "SO_SNDBUF; -1 uses the OS default."),
    K("socket.receive.buffer.bytes", INT, 102400, HIGH, None, "SO_RCVBUF; -1 uses the OS default."),
    K("socket.request.max.bytes", INT, 104857600, HIGH, AtLeast(1), "Largest request frame accepted."),
    K("socket.listen.backlog.size", INT, 50, MEDIUM, AtLeast(1), "Pending connections queue size."),
    K("connections.max.idle.ms", LONG, 600000, MEDIUM, None, "Close connections idle this long."),
    K("socket.request.receive.timeout.ms", LONG, 30000, MEDIUM, AtLeast(1),
      "odradek: close a connection whose request, once begun, is not complete within this time."),
    K("connection.failed.authentication.delay.ms", INT, 100, LOW, AtLeast(0),
      "Delay before closing a connection that failed authentication."),
    K("max.connections", INT, INT_MAX, MEDIUM, AtLeast(0), "Connections allowed in the broker.", dynamic=True),
    K("max.connections.per.ip", INT, INT_MAX, MEDIUM, AtLeast(0), "Connections allowed from one address.",
      dynamic=True),
    K("max.connections.per.ip.overrides", STRING, "", MEDIUM, IP_OVERRIDES, "Per-address connection limits.",
      dynamic=True),
    K("max.connection.creation.rate", INT, INT_MAX, MEDIUM, AtLeast(0), "New connections per second.",
      dynamic=True),
    K("queued.max.requests", INT, 500, HIGH, AtLeast(1), "Requests queued before reads stop."),
    K("queued.max.request.bytes", LONG, -1, MEDIUM, None, "Queued request bytes before reads stop; -1: none."),
    K("num.network.threads", INT, 3, HIGH, AtLeast(1), "Network threads (odradek: reader tasks).",
      dynamic=True),
    K("num.io.threads", INT, 8, HIGH, AtLeast(1), "Request handler threads.", dynamic=True),
    K("background.threads", INT, 10, HIGH, AtLeast(1), "Background task threads.", dynamic=True),
    K("num.replica.alter.log.dirs.threads", INT, None, HIGH, None, "Threads moving replicas between dirs."),
    K("request.timeout.ms", INT, 30000, HIGH, None, "Timeout of the broker's own client requests."),
    # --- limits and features
    K("message.max.bytes", INT, 1048588, HIGH, AtLeast(0), "Largest record batch accepted.", dynamic=True),
    K("fetch.max.bytes", INT, 57671680, MEDIUM, AtLeast(1024), "Most bytes returned by one fetch."),
    K("fetch.purgatory.max.wait.ms", INT, 30000, MEDIUM, AtLeast(0), "Longest a fetch waits for data, whatever "
      "max_wait_ms it asks; then it is answered with what there is. odradek only.", dynamic=True),
    K("max.incremental.fetch.session.cache.slots", INT, 1000, MEDIUM, AtLeast(0),
      "Incremental fetch sessions kept."),
    K("max.request.partition.size.limit", INT, 2000, MEDIUM, AtLeast(1), "Partitions per request, at most."),
    K("auto.create.topics.enable", BOOLEAN, True, HIGH, None, "Create unknown topics on metadata requests."),
    K("delete.topic.enable", BOOLEAN, True, HIGH, None, "Allow topic deletion."),
    K("num.partitions", INT, 1, MEDIUM, AtLeast(1), "Partitions of an auto-created topic."),
    K("default.replication.factor", INT, 1, MEDIUM, None, "Replication factor of an auto-created topic."),
    K("min.insync.replicas", INT, 1, HIGH, AtLeast(1), "ISR size an acks=all write needs.", dynamic=True),
    K("unclean.leader.election.enable", BOOLEAN, False, HIGH, None, "Allow out-of-sync leaders.",
      dynamic=True),
    K("compression.type", STRING, "producer", HIGH, COMPRESSION_TYPES, "Compression of stored batches.",
      dynamic=True),
    K("compression.gzip.level", INT, -1, MEDIUM, GZIP_LEVEL, "gzip level when the broker compresses.",
      dynamic=True),
    K("compression.lz4.level", INT, 9, MEDIUM, Between(1, 17), "lz4 level when the broker compresses.",
      dynamic=True),
    K("compression.zstd.level", INT, 3, MEDIUM, Between(-131072, 22), "zstd level when the broker compresses.",
      dynamic=True),
    K("controlled.shutdown.enable", BOOLEAN, True, MEDIUM, None, "Move leadership away before stopping."),
    K("controlled.shutdown.max.retries", INT, 3, MEDIUM, None, "Controlled shutdown attempts."),
    K("controlled.shutdown.retry.backoff.ms", LONG, 5000, MEDIUM, None, "Wait between shutdown attempts."),
    K("create.topic.policy.class.name", CLASS, None, LOW, None, "CreateTopics policy; not supported."),
    K("alter.config.policy.class.name", CLASS, None, LOW, None, "AlterConfigs policy; not supported."),
    K("metric.reporters", LIST, (), LOW, None, "Metric reporter classes; accepted, not used.", dynamic=True),
    # --- log
    K("log.dir", STRING, "/tmp/kafka-logs", HIGH, None, "Data directory, used when log.dirs is unset."),
    K("log.dirs", STRING, None, HIGH, None, "Comma-separated data directories; overrides log.dir."),
    K("log.segment.bytes", INT, 1073741824, HIGH, AtLeast(1048576), "Segment size.", dynamic=True),
    K("log.roll.ms", LONG, None, HIGH, None, "Roll a segment this old; overrides log.roll.hours.", dynamic=True),
    K("log.roll.hours", INT, 168, HIGH, AtLeast(1), "Roll a segment this old, in hours."),
    K("log.roll.jitter.ms", LONG, None, HIGH, None, "Jitter subtracted from the roll time.", dynamic=True),
    K("log.roll.jitter.hours", INT, 0, HIGH, AtLeast(0), "Roll jitter in hours."),
    K("log.retention.ms", LONG, None, HIGH, None, "Keep data this long; -1 forever. Wins over minutes and "
      "hours.", dynamic=True),
    K("log.retention.minutes", INT, None, HIGH, None, "Retention in minutes; wins over hours."),
    K("log.retention.hours", INT, 168, HIGH, None, "Retention in hours."),
    K("log.retention.bytes", LONG, -1, HIGH, None, "Partition size before old segments go; -1: no limit.",
      dynamic=True),
    K("log.retention.check.interval.ms", LONG, 300000, MEDIUM, AtLeast(1), "How often retention runs."),
    K("log.cleanup.policy", LIST, ("delete",), MEDIUM, CLEANUP_POLICIES, "delete, compact, or both.",
      dynamic=True),
    K("log.index.size.max.bytes", INT, 10485760, MEDIUM, AtLeast(4), "Offset index size.", dynamic=True),
    K("log.index.interval.bytes", INT, 4096, MEDIUM, AtLeast(0), "Bytes between offset index entries.",
      dynamic=True),
    K("log.flush.interval.messages", LONG, LONG_MAX, HIGH, AtLeast(1), "fsync after this many messages.",
      dynamic=True),
    K("log.flush.interval.ms", LONG, None, HIGH, None, "fsync data this old; default the scheduler interval.",
      dynamic=True),
    K("log.flush.scheduler.interval.ms", LONG, LONG_MAX, HIGH, None, "How often the flusher checks logs."),
    K("log.flush.offset.checkpoint.interval.ms", INT, 60000, HIGH, AtLeast(0), "Recovery point checkpoints."),
    K("log.flush.start.offset.checkpoint.interval.ms", INT, 60000, HIGH, AtLeast(0), "Log start checkpoints."),
    K("log.segment.delete.delay.ms", LONG, 60000, HIGH, AtLeast(0), "Wait before deleting a segment file.",
      dynamic=True),
    K("log.preallocate", BOOLEAN, False, MEDIUM, None, "Preallocate segment files.", dynamic=True),
    # odradek's own: Kafka leaves its writes in the page cache (see odradek.storage.page_cache)
    K("log.drop.behind.bytes", LONG, 0, LOW, AtLeast(-1), "Newest bytes of each log kept in the page "
      "cache; older written pages are dropped. 0: off (Kafka's behaviour); -1: 64 MiB when the hypervisor "
      "reclaims free memory (virtio-balloon free page reporting), else off. odradek only."),
    K("replica.drop.behind.bytes", LONG, -1, LOW, AtLeast(-1), "Newest bytes of each follower replica's "
      "log kept in the page cache (consumers read leaders); older written pages are dropped. 0: as "
      "log.drop.behind.bytes; -1: 64 MiB when the hypervisor reclaims free memory, else as "
      "log.drop.behind.bytes. odradek only."),
    K("num.recovery.threads.per.data.dir", INT, 2, HIGH, AtLeast(1), "Threads recovering each log dir.",
      dynamic=True),
    K("log.message.timestamp.type", STRING, "CreateTime", MEDIUM, TIMESTAMP_TYPES, "Timestamp stored.",
      dynamic=True),
    K("log.message.timestamp.difference.max.ms", LONG, LONG_MAX, MEDIUM, AtLeast(0),
      "Old form of the before/after bounds.", dynamic=True, removed_in="4.0"),
    K("log.message.timestamp.before.max.ms", LONG, LONG_MAX, MEDIUM, AtLeast(0),
      "How far before the broker's clock a CreateTime may be.", dynamic=True),
    K("log.message.timestamp.after.max.ms", LONG, 3600000, MEDIUM, AtLeast(0),
      "How far after the broker's clock a CreateTime may be.", dynamic=True),
    K("log.message.downconversion.enable", BOOLEAN, True, LOW, None, "Convert formats for old consumers.",
      dynamic=True, removed_in="4.0"),
    K("log.message.format.version", STRING, "3.0-IV1", MEDIUM, None, "Legacy on-disk format version.",
      removed_in="4.0"),
    K("log.dir.failure.timeout.ms", LONG, 30000, LOW, AtLeast(1), "Wait before shutting down on a failed dir."),
    K("log.local.retention.ms", LONG, -2, MEDIUM, AtLeast(-2), "Tiered storage local retention; -2: "
      "retention.ms.", dynamic=True),
    K("log.local.retention.bytes", LONG, -2, MEDIUM, AtLeast(-2), "Tiered storage local size; -2: "
      "retention.bytes.", dynamic=True),
    # --- cleaner (compaction)
    K("log.cleaner.enable", BOOLEAN, True, MEDIUM, None, "Run the log cleaner."),
    K("log.cleaner.threads", INT, 1, MEDIUM, AtLeast(0), "Cleaner threads.", dynamic=True),
    K("log.cleaner.io.max.bytes.per.second", DOUBLE, DOUBLE_MAX, MEDIUM, AtLeast(1), "Cleaner I/O throttle.",
      dynamic=True),
    K("log.cleaner.dedupe.buffer.size", LONG, 134217728, MEDIUM, AtLeast(65536),
      "Cleaner key map memory, shared by the threads.", dynamic=True),
    K("log.cleaner.io.buffer.size", INT, 524288, MEDIUM, AtLeast(4096), "Cleaner I/O buffer memory.",
      dynamic=True),
    K("log.cleaner.io.buffer.load.factor", DOUBLE, 0.9, MEDIUM, Between(0.01, 1), "Cleaner key map load factor.",
      dynamic=True),
    K("log.cleaner.backoff.ms", LONG, 15000, MEDIUM, AtLeast(0), "Cleaner sleep when idle.", dynamic=True),
    K("log.cleaner.min.cleanable.ratio", DOUBLE, 0.5, MEDIUM, Between(0, 1), "Dirty ratio that triggers "
      "cleaning.", dynamic=True),
    K("log.cleaner.delete.retention.ms", LONG, 86400000, MEDIUM, AtLeast(0), "Keep tombstones this long.",
      dynamic=True),
    K("log.cleaner.min.compaction.lag.ms", LONG, 0, MEDIUM, AtLeast(0), "Records stay uncompacted this long.",
      dynamic=True),
    K("log.cleaner.max.compaction.lag.ms", LONG, LONG_MAX, MEDIUM, AtLeast(1), "Records stay uncompacted at "
      "most this long.", dynamic=True),
    # --- replication
    K("controller.socket.timeout.ms", INT, 30000, MEDIUM, None, "Controller-to-broker socket timeout."),
    K("replica.lag.time.max.ms", LONG, 30000, HIGH, None, "A follower this far behind leaves the ISR."),
    K("replica.socket.timeout.ms", INT, 30000, HIGH, None, "Replica fetcher socket timeout."),
    K("replica.socket.receive.buffer.bytes", INT, 65536, HIGH, None, "Replica fetcher SO_RCVBUF."),
    K("replica.fetch.max.bytes", INT, 1048576, MEDIUM, AtLeast(0), "Bytes per partition a follower fetches."),
    K("replica.fetch.wait.max.ms", INT, 500, HIGH, None, "Follower fetch max wait."),
    K("replica.fetch.min.bytes", INT, 1, HIGH, None, "Follower fetch min bytes."),
    K("replica.fetch.backoff.ms", INT, 1000, MEDIUM, AtLeast(0), "Follower sleep after a fetch error."),
    K("replica.fetch.response.max.bytes", INT, 10485760, MEDIUM, AtLeast(0), "Bytes per follower fetch."),
    # Kafka's ConfigDef has no validator here, but its DynamicThreadPool refuses a count below 1 and a
    # fetcher manager with none divides by zero: odradek refuses it everywhere.
    K("num.replica.fetchers", INT, 1, HIGH, AtLeast(1), "Fetcher tasks per source broker.", dynamic=True),
    K("replica.high.watermark.checkpoint.interval.ms", LONG, 5000, HIGH, None, "High watermark checkpoints."),
    K("fetch.purgatory.purge.interval.requests", INT, 1000, MEDIUM, None, "Fetch purgatory purge interval."),
    K("producer.purgatory.purge.interval.requests", INT, 1000, MEDIUM, None, "Produce purgatory purge "
      "interval."),
    K("delete.records.purgatory.purge.interval.requests", INT, 1, MEDIUM, None, "DeleteRecords purgatory "
      "purge interval."),
    K("auto.leader.rebalance.enable", BOOLEAN, True, HIGH, None, "Move leadership back to preferred replicas."),
    K("leader.imbalance.per.broker.percentage", INT, 10, HIGH, None, "Imbalance that triggers a rebalance."),
    K("leader.imbalance.check.interval.seconds", LONG, 300, HIGH, AtLeast(1), "Leader balance check period."),
    K("replica.selector.class", STRING, None, MEDIUM, None, "Follower-fetching replica selector."),
    # --- groups and offsets
    K("group.min.session.timeout.ms", INT, 6000, MEDIUM, None, "Smallest classic-group session timeout."),
    K("group.max.session.timeout.ms", INT, 1800000, MEDIUM, None, "Largest classic-group session timeout."),
    K("group.initial.rebalance.delay.ms", INT, 3000, MEDIUM, None, "Wait for more members of a new group."),
    K("group.max.size", INT, INT_MAX, MEDIUM, AtLeast(1), "Members of one classic group, at most."),
    K("group.coordinator.rebalance.protocols", LIST, ("classic", "consumer"), MEDIUM,
      ListOf(("classic", "consumer", "share", "streams")), "Group protocols enabled."),
    K("group.consumer.session.timeout.ms", INT, 45000, MEDIUM, AtLeast(1), "KIP-848 session timeout."),
    K("group.consumer.min.session.timeout.ms", INT, 45000, MEDIUM, AtLeast(1), "KIP-848 min session timeout."),
    K("group.consumer.max.session.timeout.ms", INT, 60000, MEDIUM, AtLeast(1), "KIP-848 max session timeout."),
    K("group.consumer.heartbeat.interval.ms", INT, 5000, MEDIUM, AtLeast(1), "KIP-848 heartbeat interval."),
    K("group.consumer.min.heartbeat.interval.ms", INT, 5000, MEDIUM, AtLeast(1), "KIP-848 min heartbeat."),
    K("group.consumer.max.heartbeat.interval.ms", INT, 15000, MEDIUM, AtLeast(1), "KIP-848 max heartbeat."),
    K("group.consumer.max.size", INT, INT_MAX, MEDIUM, AtLeast(1), "Members of one consumer group, at most."),
    K("group.consumer.assignors", LIST, ("uniform", "range"), MEDIUM, None, "Server-side assignors; the "
      "first is the default."),
    K("group.consumer.client.assignors.enable", BOOLEAN, False, MEDIUM, None, "odradek extension: members may "
      "compute the assignment with client-side assignors (docs/extensions.md)."),
    K("group.consumer.migration.policy", STRING, "bidirectional", MEDIUM,
      OneOf(("disabled", "downgrade", "upgrade", "bidirectional")), "Classic/consumer group conversion."),
    K("group.consumer.regex.refresh.interval.ms", INT, 600000, MEDIUM, AtLeast(1), "Subscription regexes are "
      "resolved again at least this often (Kafka's internal setting, at least 10000 there; lower for tests)."),
    K("offset.metadata.max.bytes", INT, 4096, HIGH, None, "Largest offset commit metadata."),
    K("offsets.load.buffer.size", INT, 5242880, HIGH, AtLeast(1), "Read size when loading offsets."),
    K("offsets.topic.replication.factor", SHORT, 3, HIGH, AtLeast(1), "__consumer_offsets replication."),
    K("offsets.topic.num.partitions", INT, 50, HIGH, AtLeast(1), "__consumer_offsets partitions."),
    K("offsets.topic.segment.bytes", INT, 104857600, HIGH, AtLeast(1), "__consumer_offsets segment size."),
    K("offsets.topic.compression.codec", INT, 0, HIGH, None, "__consumer_offsets compression codec id."),
    K("offsets.retention.minutes", INT, 10080, HIGH, AtLeast(1), "Keep committed offsets of empty groups."),
    K("offsets.retention.check.interval.ms", LONG, 600000, HIGH, AtLeast(1), "Stale offset check period."),
    K("offsets.commit.timeout.ms", INT, 5000, HIGH, AtLeast(1), "Offset commit replication wait."),
    # --- transactions
    K("transaction.state.log.num.partitions", INT, 50, HIGH, AtLeast(1), "__transaction_state partitions."),
    K("transaction.state.log.replication.factor", SHORT, 3, HIGH, AtLeast(1), "__transaction_state "
      "replication."),
    K("transaction.state.log.min.isr", INT, 2, HIGH, AtLeast(1), "__transaction_state min.insync.replicas."),
    K("transaction.state.log.segment.bytes", INT, 104857600, HIGH, AtLeast(1), "__transaction_state segment "
      "size."),
    K("transaction.state.log.load.buffer.size", INT, 5242880, HIGH, AtLeast(1), "Read size when loading "
      "transactions."),
    K("transaction.max.timeout.ms", INT, 900000, HIGH, AtLeast(1), "Largest transaction timeout allowed."),
    K("transactional.id.expiration.ms", INT, 604800000, HIGH, AtLeast(1), "Forget idle transactional ids."),
    K("transaction.abort.timed.out.transaction.cleanup.interval.ms", INT, 10000, LOW, AtLeast(1),
      "Timed-out transaction check period."),
    K("transaction.remove.expired.transaction.cleanup.interval.ms", INT, 3600000, LOW, AtLeast(1),
      "Expired transactional id check period."),
    K("transaction.partition.verification.enable", BOOLEAN, True, LOW, None, "Verify transactional "
      "partitions before appends.", dynamic=True),
    K("add.partitions.to.txn.retry.backoff.ms", INT, 20, LOW, AtLeast(1), "Backoff of a leader's retry "
      "when adding a partition to a transaction meets CONCURRENT_TRANSACTIONS."),
    K("add.partitions.to.txn.retry.backoff.max.ms", INT, 100, LOW, AtLeast(0), "How long a leader retries "
      "adding a partition to a transaction (capped by request.timeout.ms)."),
    K("producer.id.expiration.ms", INT, 86400000, LOW, AtLeast(1), "Forget idle idempotent producers.",
      dynamic=True),
    # --- quotas
    K("quota.window.num", INT, 11, LOW, AtLeast(1), "Client quota samples kept."),
    K("quota.window.size.seconds", INT, 1, LOW, AtLeast(1), "Client quota sample length."),
    K("replication.quota.window.num", INT, 11, LOW, AtLeast(1), "Replication quota samples kept."),
    K("replication.quota.window.size.seconds", INT, 1, LOW, AtLeast(1), "Replication quota sample length."),
    K("alter.log.dirs.replication.quota.window.num", INT, 11, LOW, AtLeast(1),
      "Samples kept of the rate of replica moves between log dirs."),
    K("alter.log.dirs.replication.quota.window.size.seconds", INT, 1, LOW, AtLeast(1),
      "Sample length of the rate of replica moves between log dirs."),
    K("replica.alter.log.dirs.io.max.bytes.per.second", LONG, LONG_MAX, MEDIUM, AtLeast(0),
      "Upper bound (bytes/s) on the disk I/O of replica moves between the log dirs of this broker; "
      "Kafka reads it from dynamic config only.", dynamic=True),
    K("client.quota.callback.class", CLASS, None, LOW, None, "Custom quota callback; not supported."),
    # --- security: authorization
    K("authorizer.class.name", STRING, "", LOW, None, "Authorizer; empty disables ACL checks."),
    K("super.users", STRING, None, MEDIUM, None, "Principals allowed everything, User:a;User:b."),
    K("allow.everyone.if.no.acl.found", BOOLEAN, False, MEDIUM, None, "Allow access to resources without ACLs."),
    K("principal.builder.class", CLASS, "org.apache.kafka.common.security.authenticator."
      "DefaultKafkaPrincipalBuilder", MEDIUM, None, "Principal builder.", dynamic=True),
    # --- security: SASL
    K("sasl.enabled.mechanisms", LIST, ("GSSAPI",), MEDIUM, None, "SASL mechanisms offered.", dynamic=True),
    K("sasl.mechanism.inter.broker.protocol", STRING, "GSSAPI", MEDIUM, None, "SASL mechanism between brokers.",
      dynamic=True),
    K("sasl.jaas.config", PASSWORD, None, MEDIUM, None, "JAAS login context (users for PLAIN/SCRAM).",
      dynamic=True),
    K("sasl.server.callback.handler.class", CLASS, None, MEDIUM, None, "SASL server callback handler."),
    K("sasl.kerberos.service.name", STRING, None, MEDIUM, None, "Kerberos service name.", dynamic=True),
    # Reconfigurable in Kafka (DynamicListenerConfig), per broker; accepted, not used: no Kerberos or
    # OAUTHBEARER login here.
    K("sasl.kerberos.kinit.cmd", STRING, "/usr/bin/kinit", MEDIUM, None, "Kerberos kinit command.",
      dynamic=True),
    K("sasl.kerberos.ticket.renew.window.factor", DOUBLE, 0.8, MEDIUM, None, "Renew a Kerberos ticket "
      "after this share of its lifetime.", dynamic=True),
    K("sasl.kerberos.ticket.renew.jitter", DOUBLE, 0.05, MEDIUM, None, "Jitter added to the renewal "
      "time.", dynamic=True),
    K("sasl.kerberos.min.time.before.relogin", LONG, 60000, MEDIUM, None, "Least time between Kerberos "
      "relogins.", dynamic=True),
    K("sasl.kerberos.principal.to.local.rules", LIST, ("DEFAULT",), MEDIUM, None, "Kerberos principal "
      "to short name rules.", dynamic=True),
    K("sasl.login.refresh.window.factor", DOUBLE, 0.8, MEDIUM, None, "Refresh a login credential after "
      "this share of its lifetime.", dynamic=True),
    K("sasl.login.refresh.window.jitter", DOUBLE, 0.05, MEDIUM, None, "Jitter added to the refresh "
      "time.", dynamic=True),
    K("sasl.login.refresh.min.period.seconds", SHORT, 60, MEDIUM, None, "Least time between credential "
      "refreshes.", dynamic=True),
    K("sasl.login.refresh.buffer.seconds", SHORT, 300, MEDIUM, None, "Refresh this long before the "
      "credential expires.", dynamic=True),
    K("sasl.server.max.receive.size", INT, 524288, MEDIUM, None, "Largest SASL frame before authentication."),
    K("connections.max.reauth.ms", LONG, 0, MEDIUM, None, "Force re-authentication; 0 disables."),
    # --- security: TLS
    K("ssl.protocol", STRING, "TLSv1.3", MEDIUM, None, "TLS protocol.", dynamic=True),
    K("ssl.enabled.protocols", LIST, ("TLSv1.2", "TLSv1.3"), MEDIUM, None, "TLS versions enabled.",
      dynamic=True),
    K("ssl.cipher.suites", LIST, (), MEDIUM, None, "Cipher suites; empty: the library default.", dynamic=True),
    K("ssl.keystore.type", STRING, "JKS", MEDIUM, None, "Key store format (odradek reads PEM).", dynamic=True),
    K("ssl.keystore.location", STRING, None, MEDIUM, None, "Key store file.", dynamic=True),
    K("ssl.keystore.password", PASSWORD, None, MEDIUM, None, "Key store password.", dynamic=True),
    K("ssl.key.password", PASSWORD, None, MEDIUM, None, "Private key password.", dynamic=True),
    K("ssl.keystore.key", PASSWORD, None, MEDIUM, None, "PEM private key, inline.", dynamic=True),
    K("ssl.keystore.certificate.chain", PASSWORD, None, MEDIUM, None, "PEM certificate chain, inline.",
      dynamic=True),
    K("ssl.truststore.type", STRING, "JKS", MEDIUM, None, "Trust store format (odradek reads PEM).",
      dynamic=True),
    K("ssl.truststore.location", STRING, None, MEDIUM, None, "Trust store file.", dynamic=True),
    K("ssl.truststore.password", PASSWORD, None, MEDIUM, None, "Trust store password.", dynamic=True),
    K("ssl.truststore.certificates", PASSWORD, None, MEDIUM, None, "PEM trusted certificates, inline.",
      dynamic=True),
    K("ssl.client.auth", STRING, "none", MEDIUM, OneOf(("required", "requested", "none")),
      "Require client certificates.", dynamic=True),
    K("ssl.endpoint.identification.algorithm", STRING, "https", LOW, None, "Host name verification.",
      dynamic=True),
    K("ssl.keymanager.algorithm", STRING, "SunX509", MEDIUM, None, "JVM key manager; accepted, not used.",
      dynamic=True),
    K("ssl.trustmanager.algorithm", STRING, "PKIX", MEDIUM, None, "JVM trust manager; accepted, not used.",
      dynamic=True),
    K("ssl.principal.mapping.rules", STRING, "DEFAULT", LOW, None, "Certificate DN to principal rules."),
    K("ssl.provider", STRING, None, MEDIUM, None, "JVM security provider; accepted, not used.", dynamic=True),
    K("ssl.secure.random.implementation", STRING, None, LOW, None, "JVM SecureRandom; accepted, not used.",
      dynamic=True),
    K("ssl.engine.factory.class", CLASS, None, LOW, None, "JVM SSLEngine factory; accepted, not used.",
      dynamic=True),
)

TOPIC_CONFIGS: dict[str, ConfigKey] = _defs(
    K("cleanup.policy", LIST, ("delete",), MEDIUM, CLEANUP_POLICIES, "delete, compact, or both."),
    K("compression.type", STRING, "producer", MEDIUM, COMPRESSION_TYPES, "Compression of stored batches."),
    K("compression.gzip.level", INT, -1, MEDIUM, GZIP_LEVEL, "gzip level when the broker compresses."),
    K("compression.lz4.level", INT, 9, MEDIUM, Between(1, 17), "lz4 level when the broker compresses."),
    K("compression.zstd.level", INT, 3, MEDIUM, Between(-131072, 22), "zstd level when the broker compresses."),
    K("delete.retention.ms", LONG, 86400000, MEDIUM, log_range("delete.retention.ms"), "Keep tombstones this long."),
    K("file.delete.delay.ms", LONG, 60000, MEDIUM, log_range("file.delete.delay.ms"),
      "Wait before deleting a segment file."),
    K("flush.messages", LONG, LONG_MAX, MEDIUM, log_range("flush.messages"), "fsync after this many messages."),
    K("flush.ms", LONG, LONG_MAX, MEDIUM, log_range("flush.ms"), "fsync data this old."),
    K("follower.replication.throttled.replicas", LIST, (), MEDIUM, THROTTLED_REPLICAS,
      "Replicas throttled on the follower side."),
    K("index.interval.bytes", INT, 4096, MEDIUM, log_range("index.interval.bytes"),
      "Bytes between offset index entries."),
    K("leader.replication.throttled.replicas", LIST, (), MEDIUM, THROTTLED_REPLICAS,
      "Replicas throttled on the leader side."),
    K("local.retention.bytes", LONG, -2, MEDIUM, AtLeast(-2), "Tiered storage local size."),
    K("local.retention.ms", LONG, -2, MEDIUM, AtLeast(-2), "Tiered storage local retention."),
    K("max.compaction.lag.ms", LONG, LONG_MAX, MEDIUM, log_range("max.compaction.lag.ms"),
      "Records stay uncompacted at most this long."),
    K("max.message.bytes", INT, 1048588, MEDIUM, AtLeast(0), "Largest record batch accepted."),
    K("message.downconversion.enable", BOOLEAN, True, LOW, None, "Convert formats for old consumers.",
      removed_in="4.0"),
    K("message.format.version", STRING, "3.0-IV1", MEDIUM, None, "Legacy on-disk format version.",
      removed_in="4.0"),
    K("message.timestamp.after.max.ms", LONG, 3600000, MEDIUM, AtLeast(0),
      "How far after the broker's clock a CreateTime may be."),
    K("message.timestamp.before.max.ms", LONG, LONG_MAX, MEDIUM, AtLeast(0),
      "How far before the broker's clock a CreateTime may be."),
    K("message.timestamp.difference.max.ms", LONG, LONG_MAX, MEDIUM, AtLeast(0),
      "Old form of the before/after bounds.", removed_in="4.0"),
    K("message.timestamp.type", STRING, "CreateTime", MEDIUM, TIMESTAMP_TYPES, "Timestamp stored."),
    K("min.cleanable.dirty.ratio", DOUBLE, 0.5, MEDIUM, log_range("min.cleanable.dirty.ratio"),
      "Dirty ratio that triggers cleaning."),
    K("min.compaction.lag.ms", LONG, 0, MEDIUM, log_range("min.compaction.lag.ms"),
      "Records stay uncompacted this long."),
    K("min.insync.replicas", INT, 1, MEDIUM, AtLeast(1), "ISR size an acks=all write needs."),
    K("preallocate", BOOLEAN, False, MEDIUM, None, "Preallocate segment files."),
    K("remote.log.copy.disable", BOOLEAN, False, MEDIUM, None, "Tiered storage: stop copying."),
    K("remote.log.delete.on.disable", BOOLEAN, False, MEDIUM, None, "Tiered storage: delete on disable."),
    K("remote.storage.enable", BOOLEAN, False, MEDIUM, None, "Tiered storage; not supported by odradek."),
    K("retention.bytes", LONG, -1, MEDIUM, log_range("retention.bytes"),
      "Partition size before old segments go; any negative value: no limit."),
    K("retention.ms", LONG, 604800000, MEDIUM, log_range("retention.ms"), "Keep data this long; -1 forever."),
    K("segment.bytes", INT, 1073741824, MEDIUM, AtLeast(1048576), "Segment size."),
    K("segment.index.bytes", INT, 10485760, MEDIUM, log_range("segment.index.bytes"), "Offset index size."),
    K("segment.jitter.ms", LONG, 0, MEDIUM, AtLeast(0), "Jitter subtracted from the roll time."),
    K("segment.ms", LONG, 604800000, MEDIUM, log_range("segment.ms"), "Roll a segment this old."),
    K("unclean.leader.election.enable", BOOLEAN, False, MEDIUM, None, "Allow out-of-sync leaders."),
)


@dataclass(frozen=True)
class Synonym:
    """A broker key that gives a value, and the factor from its unit to the target's (ms)."""

    name: str
    factor: int = 1


_H, _M = MS_PER_HOUR, MS_PER_MINUTE

# Topic config -> broker synonyms, in Kafka's precedence order (ServerTopicConfigSynonyms).
TOPIC_CONFIG_SYNONYMS: dict[str, tuple[Synonym, ...]] = {
    "segment.bytes": (Synonym("log.segment.bytes"),),
    "segment.ms": (Synonym("log.roll.ms"), Synonym("log.roll.hours", _H)),
    "segment.jitter.ms": (Synonym("log.roll.jitter.ms"), Synonym("log.roll.jitter.hours", _H)),
    "segment.index.bytes": (Synonym("log.index.size.max.bytes"),),
    "flush.messages": (Synonym("log.flush.interval.messages"),),
    "flush.ms": (Synonym("log.flush.interval.ms"), Synonym("log.flush.scheduler.interval.ms")),
    "retention.bytes": (Synonym("log.retention.bytes"),),
    "retention.ms": (Synonym("log.retention.ms"), Synonym("log.retention.minutes", _M),
                     Synonym("log.retention.hours", _H)),
    "max.message.bytes": (Synonym("message.max.bytes"),),
    "index.interval.bytes": (Synonym("log.index.interval.bytes"),),
    "delete.retention.ms": (Synonym("log.cleaner.delete.retention.ms"),),
    "min.compaction.lag.ms": (Synonym("log.cleaner.min.compaction.lag.ms"),),
    "max.compaction.lag.ms": (Synonym("log.cleaner.max.compaction.lag.ms"),),
    "file.delete.delay.ms": (Synonym("log.segment.delete.delay.ms"),),
    "min.cleanable.dirty.ratio": (Synonym("log.cleaner.min.cleanable.ratio"),),
    "cleanup.policy": (Synonym("log.cleanup.policy"),),
    "unclean.leader.election.enable": (Synonym("unclean.leader.election.enable"),),
    "min.insync.replicas": (Synonym("min.insync.replicas"),),
    "compression.type": (Synonym("compression.type"),),
    "compression.gzip.level": (Synonym("compression.gzip.level"),),
    "compression.lz4.level": (Synonym("compression.lz4.level"),),
    "compression.zstd.level": (Synonym("compression.zstd.level"),),
    "preallocate": (Synonym("log.preallocate"),),
    "message.format.version": (Synonym("log.message.format.version"),),
    "message.timestamp.type": (Synonym("log.message.timestamp.type"),),
    "message.timestamp.difference.max.ms": (Synonym("log.message.timestamp.difference.max.ms"),),
    "message.timestamp.before.max.ms": (Synonym("log.message.timestamp.before.max.ms"),),
    "message.timestamp.after.max.ms": (Synonym("log.message.timestamp.after.max.ms"),),
    "message.downconversion.enable": (Synonym("log.message.downconversion.enable"),),
    "local.retention.ms": (Synonym("log.local.retention.ms"),),
    "local.retention.bytes": (Synonym("log.local.retention.bytes"),),
}

# Broker keys that name one value several ways (DynamicBrokerConfig.brokerConfigSynonyms): the first is
# the primary; `BrokerConfig.get(primary)` resolves the group. Setting any member dynamically hides the
# whole group at lower layers.
BROKER_SYNONYM_GROUPS: tuple[tuple[Synonym, ...], ...] = (
    TOPIC_CONFIG_SYNONYMS["segment.ms"],
    TOPIC_CONFIG_SYNONYMS["segment.jitter.ms"],
    TOPIC_CONFIG_SYNONYMS["flush.ms"],
    TOPIC_CONFIG_SYNONYMS["retention.ms"],
)

# Prefixes of keys Kafka accepts beyond the table: per-listener overrides of security and socket keys
# (`listener.name.<listener>.<key>`, `listener.name.<listener>.<mechanism>.sasl.jaas.config`) and
# config providers. They are kept, validated where the base key is known, and not reported as unknown.
LISTENER_PREFIX = "listener.name."
ACCEPTED_PREFIXES = (LISTENER_PREFIX, "config.providers")

# Dynamic keys that only a single broker may set, never the cluster-wide default (Kafka's
# DynamicBrokerConfig.PerBrokerConfigs: the security configs and DynamicListenerConfig's reconfigurable
# configs but the cluster-level max.connections, max.connection.creation.rate and num.network.threads).
PER_BROKER_CONFIGS = frozenset({
    "listeners", "advertised.listeners", "listener.security.protocol.map", "principal.builder.class",
    "ssl.protocol", "ssl.provider", "ssl.enabled.protocols", "ssl.cipher.suites", "ssl.keystore.type",
    "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password", "ssl.keystore.key",
    "ssl.keystore.certificate.chain", "ssl.truststore.type", "ssl.truststore.location",
    "ssl.truststore.password", "ssl.truststore.certificates", "ssl.client.auth",
    "ssl.endpoint.identification.algorithm", "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm",
    "ssl.secure.random.implementation", "ssl.engine.factory.class",
    "sasl.enabled.mechanisms", "sasl.mechanism.inter.broker.protocol", "sasl.jaas.config",
    "sasl.kerberos.service.name", "sasl.kerberos.kinit.cmd", "sasl.kerberos.ticket.renew.window.factor",
    "sasl.kerberos.ticket.renew.jitter", "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.principal.to.local.rules", "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter", "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.buffer.seconds",
})

# Where odradek's default differs from Kafka's, and why.
ODRADEK_DEFAULTS: dict[str, Any] = {
    # `odradek serve` is a developer's broker: loopback only, data next to the working directory.
    "listeners": "PLAINTEXT://localhost:9092",
    "log.dir": "./odradek-data",
}

# Further defaults when there is no zookeeper.connect: one broker that is its own controller, so it has
# an id of its own and internal topics that one replica can hold (Kafka's sample server.properties sets
# the same three replication keys to 1).
EMBEDDED_DEFAULTS: dict[str, Any] = {
    "broker.id": 0,
    "offsets.topic.replication.factor": 1,
    "transaction.state.log.replication.factor": 1,
    "transaction.state.log.min.isr": 1,
}

for _name in PER_BROKER_CONFIGS:
    assert BROKER_CONFIGS[_name].dynamic, _name
for _table in (ODRADEK_DEFAULTS, EMBEDDED_DEFAULTS):
    for _name in _table:
        assert _name in BROKER_CONFIGS, _name
for _topic, _synonyms in TOPIC_CONFIG_SYNONYMS.items():
    assert _topic in TOPIC_CONFIGS, _topic
    for _synonym in _synonyms:
        assert _synonym.name in BROKER_CONFIGS, _synonym.name


def accepted_range(key: ConfigKey) -> tuple[float, float]:
    """The least and greatest numbers a numeric key accepts: its type's range narrowed by its validator."""
    low, high = {INT: (INT_MIN, INT_MAX), SHORT: (SHORT_MIN, SHORT_MAX), LONG: (LONG_MIN, LONG_MAX),
                 DOUBLE: (-DOUBLE_MAX, DOUBLE_MAX)}[key.type]
    if isinstance(key.validator, (AtLeast, Between)):
        low = max(low, key.validator.minimum)
    if isinstance(key.validator, Between):
        high = min(high, key.validator.maximum)
    return low, high


# Whatever a definition accepts, the storage layer accepts: the topic keys and the broker keys that
# give their defaults (a synonym without a range of its own is checked through its topic key).
for _topic, (_low, _high) in LOG_CONFIG_BOUNDS.items():
    _least, _most = accepted_range(TOPIC_CONFIGS[_topic])
    assert _low <= _least and _most <= _high, (_topic, _least, _most)
    for _synonym in TOPIC_CONFIG_SYNONYMS.get(_topic, ()):
        _key = BROKER_CONFIGS[_synonym.name]
        if _key.validator is not None:
            _least, _most = accepted_range(_key)
            assert _low <= _least * _synonym.factor and _most * _synonym.factor <= _high, (_synonym.name,)
assert set(CLEANUP_POLICIES.choices) == set(LOG_CLEANUP_POLICIES)
