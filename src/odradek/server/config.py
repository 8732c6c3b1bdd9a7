"""Broker and topic configuration: reading server.properties, precedence, validation, DescribeConfigs.

The definitions (names, types, defaults, ranges, synonyms) are data in `config_defs`; this module applies
them.

Broker values come from four layers, highest first, as in Kafka's DynamicBrokerConfig:
  1. dynamic per-broker config (AlterConfigs on `broker=<id>`)  -> DYNAMIC_BROKER_CONFIG
  2. dynamic cluster default (AlterConfigs on the default broker) -> DYNAMIC_DEFAULT_BROKER_CONFIG
  3. server.properties plus `--override KEY=VALUE`                -> STATIC_BROKER_CONFIG
  4. the built-in default (Kafka's, or odradek's where listed)     -> DEFAULT_CONFIG
A key set at a higher layer hides its whole synonym group below it: a dynamic `log.retention.hours`
wins over a static `log.retention.ms`. Within one layer the group's precedence applies: `log.retention.ms`
over `log.retention.minutes` over `log.retention.hours`; a negative retention means unlimited (-1).

A topic's value is its override (TOPIC_CONFIG) if set, else the broker's value of its synonyms
(`retention.ms` <- `log.retention.*`), else the topic default. DescribeConfigs reports each value with
its source and its synonyms, ordered by source and then by synonym precedence, as Kafka does.

Every value that can be set can be applied (issue 26): a topic's resolved config builds its storage
`LogConfig` (`TopicConfig.log_config`), and a broker config checks the value each synonym gives its
topic key against that key's definition, so an admin request answers INVALID_CONFIG (INVALID_REQUEST
for a broker resource, as Kafka) before anything is stored. What is already stored is read leniently
(`BrokerConfig.with_stored_dynamic`, `TopicConfig.resolve_stored`): a value that cannot be applied is
logged once, with its key, value, entity and reason, and its default used, so a broker never fails to
start over a stored config.

One deliberate difference from Kafka: describing a topic config whose broker value comes from a
secondary synonym (retention.ms with only `log.retention.hours` set) reports that synonym and its real
source. Kafka drops every synonym before the primary name there and reports DEFAULT_CONFIG with no
synonyms even when `log.retention.hours` was set in server.properties.
"""

from __future__ import annotations

import base64
import logging
import math
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from odradek.properties import load_properties, parse_properties
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.server.config_defs import (
    ACCEPTED_PREFIXES,
    BROKER_CONFIGS,
    BROKER_SYNONYM_GROUPS,
    EMBEDDED_DEFAULTS,
    INT_MAX,
    INT_MIN,
    LISTENER_PREFIX,
    LONG_MAX,
    LONG_MIN,
    ODRADEK_DEFAULTS,
    PER_BROKER_CONFIGS,
    SHORT_MAX,
    SHORT_MIN,
    TOPIC_CONFIG_SYNONYMS,
    TOPIC_CONFIGS,
    ConfigKey,
    ConfigSource,
    ConfigType,
    Endpoint,
    Password,
    Synonym,
    parse_listeners,
    parse_protocol_map,
)
from odradek.storage.config import LogConfig, LogConfigError, check_log_value

log = logging.getLogger("odradek.config")


class ConfigError(KafkaApiError):
    """An invalid configuration; as an API error it is INVALID_CONFIG with Kafka's message."""

    def __init__(self, key: str, value: object, reason: str, message: str | None = None) -> None:
        self.key = key
        self.value = value
        self.reason = reason
        shown = "[hidden]" if isinstance(value, Password) else value
        super().__init__(ErrorCode.INVALID_CONFIG,
                         message or f"Invalid value {shown} for configuration {key}: {reason}")

    def __str__(self) -> str:
        return self.detail


def parse_overrides(pairs: Iterable[str]) -> dict[str, str]:
    """`--override KEY=VALUE` arguments, split at the first '='."""
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(pair, pair, "expected KEY=VALUE",
                              message=f"Invalid command line property {pair!r}: expected KEY=VALUE")
        result[key.strip()] = value
    return result


# ---------------------------------------------------------------------------------------------------
# Values


_INTEGER = re.compile(r"[+-]?[0-9]+")
_DOUBLE = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[dDfF]?")
_LIST_SPLIT = re.compile(r"\s*,\s*")
_RANGES = {ConfigType.INT: (INT_MIN, INT_MAX), ConfigType.SHORT: (SHORT_MIN, SHORT_MAX),
           ConfigType.LONG: (LONG_MIN, LONG_MAX)}


def parse_value(key: ConfigKey, raw: object) -> Any:
    """Convert a raw value (usually a string) to the key's type, then validate it. Raises ConfigError."""
    value = _convert(key, raw)
    if key.validator is not None:
        reason = key.validator.check(value)
        if reason is not None:
            raise ConfigError(key.name, raw, reason)
    return value


def _convert(key: ConfigKey, raw: object) -> Any:
    if raw is None:
        return None
    if not isinstance(raw, str):
        return _convert_typed(key, raw)
    text = raw.strip()
    kind = key.type
    if kind is ConfigType.BOOLEAN:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise ConfigError(key.name, raw, "Expected value to be either true or false")
    if kind in _RANGES:
        low, high = _RANGES[kind]
        if _INTEGER.fullmatch(text) and low <= int(text) <= high:
            return int(text)
        raise ConfigError(key.name, raw, f"Not a number of type {kind.name}")
    if kind is ConfigType.DOUBLE:
        if _DOUBLE.fullmatch(text):
            return float(text.rstrip("dDfF"))
        raise ConfigError(key.name, raw, "Not a number of type DOUBLE")
    if kind is ConfigType.LIST:
        return () if not text else tuple(_LIST_SPLIT.split(text))
    if kind is ConfigType.PASSWORD:
        return Password(text)
    return text  # STRING, CLASS


def _convert_typed(key: ConfigKey, raw: object) -> Any:
    kind = key.type
    if kind is ConfigType.BOOLEAN and isinstance(raw, bool):
        return raw
    if kind in _RANGES and isinstance(raw, int) and not isinstance(raw, bool):
        low, high = _RANGES[kind]
        if low <= raw <= high:
            return raw
    if kind is ConfigType.DOUBLE and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if kind is ConfigType.LIST and isinstance(raw, (list, tuple)):
        return tuple(str(item).strip() for item in raw)
    if kind is ConfigType.PASSWORD and isinstance(raw, Password):
        return raw
    raise ConfigError(key.name, raw, f"Expected a value of type {kind.name}")


def value_to_string(kind: ConfigType, value: Any) -> str | None:
    """A typed value as Kafka writes it (ConfigDef.convertToString); passwords are never shown."""
    if value is None or kind is ConfigType.PASSWORD:
        return None
    if kind is ConfigType.BOOLEAN:
        return "true" if value else "false"
    if kind is ConfigType.LIST:
        return ",".join(value)
    if kind is ConfigType.DOUBLE:
        return _java_double(value)
    return str(value)


def _java_double(value: float) -> str:
    """Java's Double.toString: shortest digits, plain in [1e-3, 1e7), else d.dddE<n>."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        text = repr(float(value))
        return text if "." in text else text + ".0"
    sign, digits, exponent = Decimal(repr(float(value))).as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits)).rstrip("0") or "0"
    scientific = exponent + len(digits) - 1
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{scientific}"


# ---------------------------------------------------------------------------------------------------
# DescribeConfigs entries


@dataclass(frozen=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True)
class ConfigEntry:
    """One config as DescribeConfigs reports it. `value` is typed; `value_string` is the wire form."""

    name: str
    value: Any
    value_string: str | None
    source: ConfigSource
    synonyms: tuple[ConfigSynonym, ...]
    read_only: bool
    sensitive: bool
    type: ConfigType
    documentation: str


def _synonym_chain(layers: list[tuple[ConfigSource, Mapping[str, str | None]]],
                   names: Iterable[str], sensitive: bool) -> list[ConfigSynonym]:
    """Kafka's ordering: by source (highest first), then by synonym precedence within a source."""
    names = list(names)
    chain = []
    for source, mapping in layers:
        for name in names:
            if name in mapping and mapping[name] is not None:
                chain.append(ConfigSynonym(name, None if sensitive else mapping[name], source))
    return chain


# ---------------------------------------------------------------------------------------------------
# Broker


_GROUP_OF: dict[str, tuple[Synonym, ...]] = {s.name: group for group in BROKER_SYNONYM_GROUPS for s in group}
_PRIMARIES = {group[0].name: group for group in BROKER_SYNONYM_GROUPS}

T = TypeVar("T")


class _Key(Generic[T]):
    """A typed attribute for one config key: `num_partitions = _Key[int]("num.partitions")`."""

    def __init__(self, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> _Key[T]: ...
    @overload
    def __get__(self, instance: BrokerConfig | TopicConfig, owner: type) -> T: ...

    def __get__(self, instance: BrokerConfig | TopicConfig | None, owner: type) -> T | _Key[T]:
        return self if instance is None else instance.get_value(self.name)


def _base_key(name: str) -> ConfigKey | None:
    """The definition of a broker key, also behind a listener prefix
    (`listener.name.<l>.ssl.keystore.location`, `listener.name.<l>.<mechanism>.sasl.jaas.config`)."""
    if not name.startswith(LISTENER_PREFIX):
        return BROKER_CONFIGS.get(name)
    rest = name[len(LISTENER_PREFIX):].partition(".")[2]
    while rest:
        if rest in BROKER_CONFIGS:
            return replace(BROKER_CONFIGS[rest], name=name)
        rest = rest.partition(".")[2]
    return None


def _default_strings(embedded: bool) -> dict[str, str | None]:
    defaults: dict[str, Any] = {name: key.default for name, key in BROKER_CONFIGS.items()}
    defaults.update(ODRADEK_DEFAULTS)
    if embedded:
        defaults.update(EMBEDDED_DEFAULTS)
    return {name: value_to_string(BROKER_CONFIGS[name].type, value) for name, value in defaults.items()}


def _overlay(base: dict[str, str], top: Mapping[str, str]) -> None:
    """Kafka's overrideProps: a key set above hides its whole synonym group below."""
    for name, value in top.items():
        for synonym in _GROUP_OF.get(name, (Synonym(name),)):
            base.pop(synonym.name, None)
        base[name] = value


class BrokerConfig:
    """A broker's effective configuration. Immutable; `with_dynamic` returns an updated copy.

    Raises ConfigError on the first invalid value. Unknown keys are kept and listed in `warnings`.
    Embedded mode (no zookeeper.connect) adds `EMBEDDED_DEFAULTS` to the defaults.
    """

    def __init__(self, static: Mapping[str, str] | None = None, *,
                 dynamic_default: Mapping[str, str] | None = None,
                 dynamic_broker: Mapping[str, str] | None = None,
                 embedded: bool | None = None) -> None:
        self.static: dict[str, str] = dict(static or {})
        self.dynamic_default: dict[str, str] = dict(dynamic_default or {})
        self.dynamic_broker: dict[str, str] = dict(dynamic_broker or {})
        if embedded is None:
            embedded = not (self.static.get("zookeeper.connect") or "").strip()
        self.embedded = embedded
        self.defaults = _default_strings(embedded)
        merged = dict(self.static)
        _overlay(merged, self.dynamic_default)
        _overlay(merged, self.dynamic_broker)
        self.merged = merged
        self._values = {name: parse_value(key, merged[name] if name in merged else self.defaults[name])
                        for name, key in BROKER_CONFIGS.items()}
        self.warnings: list[str] = []
        for name, raw in merged.items():
            base = None if name in BROKER_CONFIGS else _base_key(name)
            if base is not None:
                parse_value(base, raw)
            elif name not in BROKER_CONFIGS and not name.startswith(ACCEPTED_PREFIXES):
                self.warnings.append(f"The configuration '{name}' was supplied but isn't a known config.")
        self._validate()

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Iterable[str] | Mapping[str, str] = (),
             **kwargs: Any) -> BrokerConfig:
        """server.properties (optional) plus `--override KEY=VALUE` pairs, which win."""
        static = load_properties(path) if path is not None else {}
        static.update(overrides if isinstance(overrides, Mapping) else parse_overrides(overrides))
        return cls(static, **kwargs)

    def with_dynamic(self, *, dynamic_default: Mapping[str, str] | None = None,
                     dynamic_broker: Mapping[str, str] | None = None) -> BrokerConfig:
        """A copy with new dynamic layers (each given one replaces the old). Checks what may change."""
        if dynamic_default is not None:
            validate_dynamic_update(dynamic_default, per_broker=False)
        if dynamic_broker is not None:
            validate_dynamic_update(dynamic_broker, per_broker=True)
        return BrokerConfig(
            self.static, embedded=self.embedded,
            dynamic_default=self.dynamic_default if dynamic_default is None else dynamic_default,
            dynamic_broker=self.dynamic_broker if dynamic_broker is None else dynamic_broker)

    def with_stored_dynamic(self, *, dynamic_default: Mapping[str, str] | None = None,
                            dynamic_broker: Mapping[str, str] | None = None) -> BrokerConfig:
        """`with_dynamic` for layers read from the store (at start, or from a change notification):
        a value that cannot be applied is logged and left out, its default used, instead of failing."""
        layers = {"dynamic_broker": None if dynamic_broker is None else dict(dynamic_broker),
                  "dynamic_default": None if dynamic_default is None else dict(dynamic_default)}
        entities = {"dynamic_broker": f"broker {self.broker_id}", "dynamic_default": "the cluster default broker"}
        for _ in range(sum(len(layer or ()) for layer in layers.values()) + 1):
            try:
                return self.with_dynamic(**layers)
            except ConfigError as e:
                # the per-broker layer wins over the default, so a key set in both is its
                found = next((n for n in layers if (layer := layers[n]) is not None and e.key in layer), None)
                if found is None:
                    break
                layer = layers[found]
                assert layer is not None
                warn_ignored(e.key, layer.pop(e.key), entities[found], e.detail)
        # not one stored key but their combination with the static config: the stored layers go
        for name, layer in layers.items():
            if layer:
                warn_ignored(",".join(sorted(layer)), "...", entities[name],
                             "together they cannot be applied with this broker's static config")
        return self

    # -- access

    def get(self, name: str) -> Any:
        """The typed value of a key. For the primary of a synonym group (`log.retention.ms`,
        `log.roll.ms`, `log.roll.jitter.ms`, `log.flush.interval.ms`) the group is resolved, in ms."""
        if name in _PRIMARIES:
            return self._resolve_group(_PRIMARIES[name])
        if name in self._values:
            return self._values[name]
        base = _base_key(name)
        if base is None:
            raise KeyError(f"unknown broker config {name!r}")
        return parse_value(base, self.merged.get(name))

    get_value = get

    def raw(self, name: str) -> str | None:
        """The string in effect for a key from any layer, or None when it is at its default."""
        return self.merged.get(name)

    def _resolve_group(self, group: tuple[Synonym, ...]) -> int:
        # The first member set wins; if none is, the first member with a default does.
        supplied = [s for s in group if s.name in self.merged]
        candidates = supplied or [s for s in group if self._values[s.name] is not None]
        value = self._values[candidates[0].name] * candidates[0].factor
        if group[0].name == "log.retention.ms" and value < 0:
            return -1  # any negative retention means unlimited
        return int(value)

    def layers(self) -> list[tuple[ConfigSource, Mapping[str, str | None]]]:
        """The value layers, highest precedence first, with the ConfigSource each reports."""
        return [(ConfigSource.DYNAMIC_BROKER_CONFIG, self.dynamic_broker),
                (ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG, self.dynamic_default),
                (ConfigSource.STATIC_BROKER_CONFIG, self.static),
                (ConfigSource.DEFAULT_CONFIG, self.defaults)]

    def source(self, name: str) -> ConfigSource:
        if name in self.merged:
            for source, layer in self.layers()[:3]:
                if name in layer:
                    return source
        return ConfigSource.DEFAULT_CONFIG

    def describe(self, names: Iterable[str] | None = None) -> list[ConfigEntry]:
        """DescribeConfigs entries for this broker; all defined keys when `names` is None."""
        chosen = sorted(BROKER_CONFIGS) if names is None else [n for n in names if n in BROKER_CONFIGS]
        return [self._describe_one(name) for name in chosen]

    def _describe_one(self, name: str) -> ConfigEntry:
        key = BROKER_CONFIGS[name]
        group = [s.name for s in _GROUP_OF.get(name, (Synonym(name),))]
        chain = _synonym_chain(self.layers(), group, key.sensitive)
        while chain and chain[0].name != name:  # as Kafka: higher-ranked synonyms are not listed
            chain.pop(0)
        value = self._values[name]
        source = chain[0].source if chain else ConfigSource.DEFAULT_CONFIG
        return ConfigEntry(name, value, value_to_string(key.type, value), source, tuple(chain),
                           read_only=not key.dynamic, sensitive=key.sensitive, type=key.type,
                           documentation=key.doc)

    # -- typed access to the keys the broker reads most

    @property
    def broker_id(self) -> int:
        if "broker.id" not in self.merged and "node.id" in self.merged:
            return int(self._values["node.id"])
        return int(self._values["broker.id"])

    @property
    def listeners(self) -> list[Endpoint]:
        return parse_listeners(self._values["listeners"])

    @property
    def advertised_listeners(self) -> list[Endpoint]:
        advertised = self._values["advertised.listeners"]
        return parse_listeners(advertised) if advertised else self.listeners

    @property
    def listener_security_protocol_map(self) -> dict[str, str]:
        return parse_protocol_map(self._values["listener.security.protocol.map"])

    @property
    def log_dirs(self) -> list[str]:
        dirs = self._values["log.dirs"] or self._values["log.dir"] or ""
        return [item.strip() for item in dirs.split(",") if item.strip()]

    @property
    def super_users(self) -> list[str]:
        return [item.strip() for item in (self._values["super.users"] or "").split(";") if item.strip()]

    @property
    def zookeeper_connection_timeout_ms(self) -> int:
        value = self._values["zookeeper.connection.timeout.ms"]
        return int(self._values["zookeeper.session.timeout.ms"] if value is None else value)

    log_retention_ms = _Key[int]("log.retention.ms")
    log_roll_ms = _Key[int]("log.roll.ms")
    log_roll_jitter_ms = _Key[int]("log.roll.jitter.ms")
    log_flush_interval_ms = _Key[int]("log.flush.interval.ms")
    log_retention_bytes = _Key[int]("log.retention.bytes")
    log_retention_check_interval_ms = _Key[int]("log.retention.check.interval.ms")
    log_segment_bytes = _Key[int]("log.segment.bytes")
    log_cleanup_policy = _Key[tuple[str, ...]]("log.cleanup.policy")
    log_flush_interval_messages = _Key[int]("log.flush.interval.messages")
    zookeeper_connect = _Key["str | None"]("zookeeper.connect")
    zookeeper_session_timeout_ms = _Key[int]("zookeeper.session.timeout.ms")
    num_partitions = _Key[int]("num.partitions")
    default_replication_factor = _Key[int]("default.replication.factor")
    auto_create_topics_enable = _Key[bool]("auto.create.topics.enable")
    delete_topic_enable = _Key[bool]("delete.topic.enable")
    message_max_bytes = _Key[int]("message.max.bytes")
    min_insync_replicas = _Key[int]("min.insync.replicas")
    unclean_leader_election_enable = _Key[bool]("unclean.leader.election.enable")
    compression_type = _Key[str]("compression.type")
    socket_request_max_bytes = _Key[int]("socket.request.max.bytes")
    connections_max_idle_ms = _Key[int]("connections.max.idle.ms")
    max_connections = _Key[int]("max.connections")
    max_connections_per_ip = _Key[int]("max.connections.per.ip")
    queued_max_requests = _Key[int]("queued.max.requests")
    fetch_max_bytes = _Key[int]("fetch.max.bytes")
    replica_fetch_max_bytes = _Key[int]("replica.fetch.max.bytes")
    replica_lag_time_max_ms = _Key[int]("replica.lag.time.max.ms")
    offsets_topic_num_partitions = _Key[int]("offsets.topic.num.partitions")
    offsets_topic_replication_factor = _Key[int]("offsets.topic.replication.factor")
    offsets_retention_minutes = _Key[int]("offsets.retention.minutes")
    group_min_session_timeout_ms = _Key[int]("group.min.session.timeout.ms")
    group_max_session_timeout_ms = _Key[int]("group.max.session.timeout.ms")
    group_initial_rebalance_delay_ms = _Key[int]("group.initial.rebalance.delay.ms")
    group_max_size = _Key[int]("group.max.size")
    transaction_state_log_num_partitions = _Key[int]("transaction.state.log.num.partitions")
    transaction_max_timeout_ms = _Key[int]("transaction.max.timeout.ms")
    transactional_id_expiration_ms = _Key[int]("transactional.id.expiration.ms")
    controlled_shutdown_enable = _Key[bool]("controlled.shutdown.enable")
    sasl_enabled_mechanisms = _Key[tuple[str, ...]]("sasl.enabled.mechanisms")
    authorizer_class_name = _Key[str]("authorizer.class.name")

    # -- cross-key checks (the parts of KafkaConfig.validateValues that apply to odradek)

    def _validate(self) -> None:
        values = self._values
        if "broker.id" in self.merged and "node.id" in self.merged and values["broker.id"] != values["node.id"]:
            raise ConfigError("node.id", values["node.id"], f"must equal broker.id ({values['broker.id']})")
        broker_id = self.broker_id
        if self.embedded and broker_id < 0:
            raise ConfigError("broker.id", broker_id, "must be at least 0 without zookeeper.connect "
                              "(there is no ZooKeeper to generate one)")
        if values["broker.id.generation.enable"]:
            if not -1 <= broker_id <= values["reserved.broker.max.id"]:
                raise ConfigError("broker.id", broker_id, "must be greater than or equal to -1 and not "
                                  "greater than reserved.broker.max.id")
        elif broker_id < 0:
            raise ConfigError("broker.id", broker_id, "must be greater than or equal to 0")
        retention = self.log_retention_ms
        if not (retention >= 1 or retention == -1):
            name = self._set_member(TOPIC_CONFIG_SYNONYMS["retention.ms"])
            raise ConfigError(name, self.merged.get(name, retention), "must be unlimited (-1) or at least 1")
        self._validate_topic_defaults()
        if not self.log_dirs:
            raise ConfigError("log.dirs", values["log.dirs"],
                              "At least one log directory must be defined via log.dirs or log.dir.")
        self._validate_limits(values)
        self._validate_listeners()

    def _set_member(self, synonyms: tuple[Synonym, ...]) -> str:
        """The member of a synonym group whose value is in effect (the first one set, else the primary)."""
        return next((s.name for s in synonyms if s.name in self.merged), synonyms[0].name)

    def _validate_topic_defaults(self) -> None:
        """The value each broker key gives a topic key must be one the topic key (and so a log) takes:
        `log.roll.ms`, `log.flush.interval.ms` and others have no range of their own (as in Kafka,
        where a bad one stops the broker at its next start)."""
        for topic, synonyms in TOPIC_CONFIG_SYNONYMS.items():
            value = self.get(synonyms[0].name)
            key = TOPIC_CONFIGS[topic]
            reason = key.validator.check(value) if key.validator is not None else None
            if reason is None and topic in _LOG_KEYS:
                reason = check_log_value(topic, value)
            if reason is not None:
                name = self._set_member(synonyms)
                raise ConfigError(name, self.merged.get(name, value), f"{reason} (as {topic})")

    def _validate_limits(self, values: dict[str, Any]) -> None:
        wait = values["replica.fetch.wait.max.ms"]
        if wait > values["replica.socket.timeout.ms"]:
            raise ConfigError("replica.socket.timeout.ms", values["replica.socket.timeout.ms"],
                              "should always be at least replica.fetch.wait.max.ms")
        if wait > values["replica.lag.time.max.ms"]:
            raise ConfigError("replica.fetch.wait.max.ms", wait,
                              "should always be less than or equal to replica.lag.time.max.ms")
        queued = values["queued.max.request.bytes"]
        if 0 < queued < values["socket.request.max.bytes"]:
            raise ConfigError("queued.max.request.bytes", queued,
                              "must be larger or equal to socket.request.max.bytes")
        if values["max.connections.per.ip"] == 0 and not values["max.connections.per.ip.overrides"]:
            raise ConfigError("max.connections.per.ip", 0,
                              "can be set to zero only if max.connections.per.ip.overrides is set")
        delay = values["connection.failed.authentication.delay.ms"]
        if delay >= values["connections.max.idle.ms"]:
            raise ConfigError("connection.failed.authentication.delay.ms", delay,
                              "should always be less than connections.max.idle.ms")

    def _validate_listeners(self) -> None:
        protocols = self.listener_security_protocol_map
        listeners = self.listeners
        if not listeners:
            raise ConfigError("listeners", self._values["listeners"], "at least one listener is needed")
        for endpoint in listeners:
            if endpoint.listener_name not in protocols:
                raise ConfigError("listeners", str(endpoint),
                                  f"No security protocol defined for listener {endpoint.listener_name}")
        ports = [e.port for e in listeners if e.port != 0]
        if len(ports) != len(set(ports)):
            raise ConfigError("listeners", self._values["listeners"], "Each listener must have a different port")
        names = {e.listener_name for e in listeners}
        for endpoint in self.advertised_listeners:
            if endpoint.host == "0.0.0.0":
                raise ConfigError("advertised.listeners", str(endpoint), "cannot use the nonroutable "
                                  "meta-address 0.0.0.0. Use a routable IP address.")
            if endpoint.listener_name not in names:
                raise ConfigError("advertised.listeners", str(endpoint),
                                  "advertised listener names must also be in listeners")


def validate_dynamic_update(props: Mapping[str, str], *, per_broker: bool) -> None:
    """Reject keys AlterConfigs may not change on a running broker, as Kafka does: keys that are not
    dynamic, and per-broker keys (listeners, key material) sent to the cluster-wide default."""
    keys = {name: _base_key(name) for name in props}
    not_dynamic = sorted(name for name, key in keys.items() if key is None or not key.dynamic)
    if not_dynamic:
        raise ConfigError(not_dynamic[0], props[not_dynamic[0]], "not dynamic",
                          message=f"Cannot update these configs dynamically: {not_dynamic}")
    if not per_broker:
        only_per_broker = sorted(name for name in props
                                 if name.startswith(LISTENER_PREFIX) or name in PER_BROKER_CONFIGS)
        if only_per_broker:
            raise ConfigError(only_per_broker[0], props[only_per_broker[0]], "per-broker only",
                              message="Cannot update these configs at default cluster level, broker id "
                                      f"must be specified: {only_per_broker}")


_WARNED_MAX = 10_000
_warned: set[tuple[str, str, str]] = set()


def warn_ignored(key: str, value: object, entity: str, reason: str) -> None:
    """One WARNING per stored value left out (again only after 10,000 others)."""
    known = _base_key(key) or TOPIC_CONFIGS.get(key)
    shown = "[hidden]" if isinstance(value, Password) or (known is not None and known.sensitive) else value
    mark = (key, repr(shown), entity)
    if mark in _warned:
        return
    if len(_warned) >= _WARNED_MAX:
        _warned.clear()
    _warned.add(mark)
    log.warning("ignoring the stored config %s=%r of %s: %s; its default applies", key, shown, entity, reason)


# ---------------------------------------------------------------------------------------------------
# Topic

# The topic keys a partition log obeys, handed to the storage layer's LogConfig by name.
LOG_CONFIG_KEYS = ("segment.bytes", "segment.ms", "segment.index.bytes", "index.interval.bytes", "retention.ms",
                   "retention.bytes", "flush.messages", "flush.ms", "file.delete.delay.ms", "cleanup.policy",
                   "delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms",
                   "min.cleanable.dirty.ratio")
_LOG_KEYS = frozenset(LOG_CONFIG_KEYS) - {"cleanup.policy"}


class TopicConfig(Mapping[str, ConfigEntry]):
    """A topic's effective configuration: every topic config name -> its ConfigEntry."""

    def __init__(self, entries: Mapping[str, ConfigEntry]) -> None:
        self._entries = dict(entries)
        props = {name: value for name in LOG_CONFIG_KEYS if (value := entries[name].value_string) is not None}
        try:
            self.log_config = LogConfig().from_properties(props)
        except LogConfigError as e:
            raise ConfigError(e.name, e.value, e.reason) from None

    @classmethod
    def resolve(cls, overrides: Mapping[str, str | None], broker: BrokerConfig) -> TopicConfig:
        """Effective values, sources and synonyms, and the config of the topic's logs; the overrides are
        validated first. Raises ConfigError for anything that could not be applied."""
        typed = validate_topic_overrides(overrides)
        layers = broker.layers()
        entries: dict[str, ConfigEntry] = {}
        for name, key in TOPIC_CONFIGS.items():
            synonyms = TOPIC_CONFIG_SYNONYMS.get(name, ())
            chain = _synonym_chain(layers, [s.name for s in synonyms], key.sensitive)
            if name in typed:
                value = typed[name]
                chain.insert(0, ConfigSynonym(name, value_to_string(key.type, value), ConfigSource.TOPIC_CONFIG))
            else:
                value = broker.get(synonyms[0].name) if synonyms else key.default
            source = chain[0].source if chain else ConfigSource.DEFAULT_CONFIG
            entries[name] = ConfigEntry(name, value, value_to_string(key.type, value), source, tuple(chain),
                                        read_only=False, sensitive=key.sensitive, type=key.type,
                                        documentation=key.doc)
        return cls(entries)

    @classmethod
    def resolve_stored(cls, overrides: Mapping[str, str | None], broker: BrokerConfig, topic: str) -> TopicConfig:
        """`resolve` for overrides read from the store: one that cannot be applied is logged and left
        out (the broker's value or the default applies) instead of failing."""
        kept = dict(overrides)
        for _ in range(len(kept)):
            try:
                return cls.resolve(kept, broker)
            except ConfigError as e:
                if e.key not in kept:
                    raise
                warn_ignored(e.key, kept.pop(e.key), f"topic {topic}", e.detail)
        return cls.resolve(kept, broker)

    def __getitem__(self, name: str) -> ConfigEntry:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get_value(self, name: str) -> Any:
        return self._entries[name].value

    def overrides(self) -> dict[str, Any]:
        """The values set on the topic itself."""
        return {n: e.value for n, e in self._entries.items() if e.source is ConfigSource.TOPIC_CONFIG}

    def describe(self, names: Iterable[str] | None = None) -> list[ConfigEntry]:
        chosen = sorted(self._entries) if names is None else [n for n in names if n in self._entries]
        return [self._entries[name] for name in chosen]

    retention_ms = _Key[int]("retention.ms")
    retention_bytes = _Key[int]("retention.bytes")
    segment_bytes = _Key[int]("segment.bytes")
    segment_ms = _Key[int]("segment.ms")
    segment_jitter_ms = _Key[int]("segment.jitter.ms")
    segment_index_bytes = _Key[int]("segment.index.bytes")
    index_interval_bytes = _Key[int]("index.interval.bytes")
    max_message_bytes = _Key[int]("max.message.bytes")
    min_insync_replicas = _Key[int]("min.insync.replicas")
    unclean_leader_election_enable = _Key[bool]("unclean.leader.election.enable")
    compression_type = _Key[str]("compression.type")
    cleanup_policy = _Key[tuple[str, ...]]("cleanup.policy")
    flush_messages = _Key[int]("flush.messages")
    flush_ms = _Key[int]("flush.ms")
    file_delete_delay_ms = _Key[int]("file.delete.delay.ms")
    delete_retention_ms = _Key[int]("delete.retention.ms")
    min_compaction_lag_ms = _Key[int]("min.compaction.lag.ms")
    max_compaction_lag_ms = _Key[int]("max.compaction.lag.ms")
    min_cleanable_dirty_ratio = _Key[float]("min.cleanable.dirty.ratio")
    message_timestamp_type = _Key[str]("message.timestamp.type")
    preallocate = _Key[bool]("preallocate")

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def message_timestamp_before_max_ms(self) -> int:
        before = int(self.get_value("message.timestamp.before.max.ms"))
        return before if before != LONG_MAX else int(self.get_value("message.timestamp.difference.max.ms"))

    @property
    def message_timestamp_after_max_ms(self) -> int:
        # The deprecated difference bound still applies when it was configured and the after bound was not.
        difference = self._entries["message.timestamp.difference.max.ms"]
        after = self._entries["message.timestamp.after.max.ms"]
        if difference.source is not ConfigSource.DEFAULT_CONFIG and after.source is ConfigSource.DEFAULT_CONFIG:
            return int(difference.value)
        return int(after.value)


def validate_topic_overrides(overrides: Mapping[str, str | None]) -> dict[str, Any]:
    """Validate topic config overrides for CreateTopics / AlterConfigs; returns the typed values.

    Errors are ConfigError, i.e. INVALID_CONFIG with Kafka's message.
    """
    nulls = sorted(name for name, value in overrides.items() if value is None)
    if nulls:
        raise ConfigError(nulls[0], None, "null value",
                          message=f"Null value not supported for topic configs: {','.join(nulls)}")
    typed: dict[str, Any] = {}
    for name, raw in overrides.items():
        key = TOPIC_CONFIGS.get(name)
        if key is None:
            raise ConfigError(name, raw, "unknown", message=f"Unknown topic config name: {name}")
        typed[name] = parse_value(key, raw)
    min_lag = typed.get("min.compaction.lag.ms", 0)
    max_lag = typed.get("max.compaction.lag.ms", LONG_MAX)
    if min_lag > max_lag:
        raise ConfigError("min.compaction.lag.ms", min_lag, "conflict",
                          message=f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > "
                                  f"max.compaction.lag.ms ({max_lag})")
    if typed.get("remote.storage.enable"):
        raise ConfigError("remote.storage.enable", overrides["remote.storage.enable"], "not supported",
                          message="Tiered storage is not supported: remote.storage.enable must be false")
    return typed


# ---------------------------------------------------------------------------------------------------
# Cluster id


def new_cluster_id() -> str:
    """A cluster id as Kafka makes one: a random UUID, URL-safe base64, no padding (22 characters).

    Like Kafka's Uuid.randomUuid, never one that starts with '-' (it would read as a command-line flag).
    The id is written once to meta.properties in every log dir (and to /cluster/id in ZooKeeper mode).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def is_valid_cluster_id(cluster_id: str) -> bool:
    """Whether a string decodes to 16 bytes of URL-safe base64, the form Kafka writes."""
    if not re.fullmatch(r"[A-Za-z0-9_-]{22}", cluster_id or ""):
        return False
    return len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


__all__ = [
    "BrokerConfig", "ConfigEntry", "ConfigError", "ConfigSource", "ConfigSynonym", "ConfigType",
    "Endpoint", "TopicConfig", "is_valid_cluster_id", "load_properties", "new_cluster_id", "parse_overrides",
    "parse_properties", "parse_value", "validate_dynamic_update", "validate_topic_overrides", "value_to_string",
    "warn_ignored", "LOG_CONFIG_KEYS",
]
