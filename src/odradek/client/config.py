"""Client configuration with Kafka's names and defaults (the Java client's, unless noted).

A config is a plain dict with dotted Kafka keys (`{"bootstrap.servers": "host:9092", "linger.ms": 5}`);
keyword arguments may spell them with underscores (`linger_ms=5`). Values may be strings, as librdkafka
configs are. Unknown keys raise `ConfigError` (DESIGN: unknown keys are reported, never ignored).

Deliberate differences from the Java client, each documented where it matters:
- `enable.idempotence` defaults to false (Java: true since 3.0). The idempotent producer here keeps one
  in-flight batch per partition (see `producer`), which is correct but slower; ask for it explicitly.
- `linger.ms` defaults to 5, as in Kafka 4.0 (KIP-1030).
- `receive.message.max.bytes` (librdkafka's name) bounds a response frame; the Java client has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from odradek.client.errors import ConfigError


@dataclass(frozen=True)
class ConfigDef:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    doc: str = ""


def _int(v) -> int:
    if isinstance(v, bool):
        raise ValueError("expected an integer")
    return int(v)


def _bool(v) -> bool:
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("true", "1", "yes"):
            return True
        if s in ("false", "0", "no"):
            return False
        raise ValueError(f"expected true or false, not {v!r}")
    return bool(v)


def _str(v) -> str:
    return str(v)


def _servers(v) -> list[tuple[str, int]]:
    items = v.split(",") if isinstance(v, str) else list(v)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "9092"
        host = host.strip("[]")
        out.append((host, int(port)))
    if not out:
        raise ValueError("bootstrap.servers is empty")
    return out


def _acks(v) -> int:
    s = str(v).strip().lower()
    if s in ("all", "-1"):
        return -1
    n = int(s)
    if n not in (0, 1):
        raise ValueError("acks must be 0, 1, all or -1")
    return n


COMPRESSION_TYPES = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _compression(v) -> int:
    s = "none" if v is None else str(v).strip().lower()
    if s not in COMPRESSION_TYPES:
        raise ValueError(f"compression.type must be one of {', '.join(COMPRESSION_TYPES)}")
    return COMPRESSION_TYPES[s]


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse(v) -> str:
        s = str(v).strip().lower()
        if s not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return s
    return parse


def _any(v):
    return v


COMMON = [
    ConfigDef("bootstrap.servers", _servers, None, "host:port list to fetch the first metadata from"),
    ConfigDef("client.id", _str, "odradek-python"),
    ConfigDef("request.timeout.ms", _int, 30000),
    ConfigDef("retry.backoff.ms", _int, 100),
    ConfigDef("retry.backoff.max.ms", _int, 1000),
    ConfigDef("reconnect.backoff.ms", _int, 50),
    ConfigDef("reconnect.backoff.max.ms", _int, 1000),
    ConfigDef("metadata.max.age.ms", _int, 300000),
    ConfigDef("socket.connection.setup.timeout.ms", _int, 10000),
    ConfigDef("max.in.flight.requests.per.connection", _int, 5),
    ConfigDef("receive.message.max.bytes", _int, 100_000_000),
    ConfigDef("client.software.name", _str, "odradek-python"),
    ConfigDef("client.software.version", _str, "0.1.0"),
    ConfigDef("bootstrap.refused.fail.fast", _bool, False,
              "odradek only: fail the first bootstrap at once when every address refuses the connection "
              "(the command-line tools set it); by default the client retries until its timeout, as Kafka's"),
]

PRODUCER = COMMON + [
    ConfigDef("acks", _acks, -1),
    ConfigDef("linger.ms", _int, 5),
    ConfigDef("batch.size", _int, 16384),
    ConfigDef("buffer.memory", _int, 33554432),
    ConfigDef("max.block.ms", _int, 60000),
    ConfigDef("max.request.size", _int, 1048576),
    ConfigDef("retries", _int, 2147483647),
    ConfigDef("delivery.timeout.ms", _int, 120000),
    ConfigDef("compression.type", _compression, 0),
    ConfigDef("enable.idempotence", _bool, False),
    ConfigDef("partitioner", _any, None, "callable(topic, key, partitions) -> partition; default murmur2"),
    ConfigDef("partitioner.ignore.keys", _bool, False),
    ConfigDef("transactional.id", _any, None, "enables transactions (and idempotence)"),
    ConfigDef("transaction.timeout.ms", _int, 60000),
    ConfigDef("allow.auto.create.topics", _bool, True),
]

CONSUMER = COMMON + [
    ConfigDef("group.id", _any, None, "kept for group membership, which comes later"),
    ConfigDef("auto.offset.reset", _choice("earliest", "latest", "none"), "latest"),
    ConfigDef("isolation.level", _choice("read_uncommitted", "read_committed"), "read_uncommitted"),
    ConfigDef("fetch.min.bytes", _int, 1),
    ConfigDef("fetch.max.wait.ms", _int, 500),
    ConfigDef("fetch.max.bytes", _int, 52428800),
    ConfigDef("max.partition.fetch.bytes", _int, 1048576),
    ConfigDef("max.poll.records", _int, 500),
    ConfigDef("check.crcs", _bool, True),
    ConfigDef("client.rack", _str, ""),
    ConfigDef("enable.auto.commit", _bool, False, "offset commit comes with group membership"),
    ConfigDef("allow.auto.create.topics", _bool, True),
]

_POSITIVE = ("request.timeout.ms", "batch.size", "buffer.memory", "max.request.size",
             "max.in.flight.requests.per.connection", "fetch.max.bytes", "max.partition.fetch.bytes",
             "max.poll.records", "receive.message.max.bytes", "delivery.timeout.ms", "transaction.timeout.ms")


def build(defs: list[ConfigDef], config: dict | None, kwargs: dict) -> dict:
    """Merge `config` and `kwargs` (underscores for dots) over the defaults; validate every value."""
    known = {d.name: d for d in defs}
    given: dict = {}
    for key, value in {**(config or {}), **{k.replace("_", "."): v for k, v in kwargs.items()}}.items():
        if key not in known:
            raise ConfigError(f"unknown configuration key {key!r}")
        given[key] = value
    out = {}
    for d in defs:
        if d.name in given and given[d.name] is not None:
            try:
                out[d.name] = d.parse(given[d.name])
            except (TypeError, ValueError) as e:
                raise ConfigError(f"invalid value {given[d.name]!r} for {d.name}: {e}") from None
        else:
            out[d.name] = d.default
    if out["bootstrap.servers"] is None:
        raise ConfigError("bootstrap.servers is required")
    for name in _POSITIVE:
        if name in out and out[name] <= 0:
            raise ConfigError(f"{name} must be positive")
    return out


def producer_config(config: dict | None = None, **kwargs) -> dict:
    out = build(PRODUCER, config, kwargs)
    if out["transactional.id"] is not None:
        out["transactional.id"] = str(out["transactional.id"])
        if not out["transactional.id"]:
            raise ConfigError("transactional.id must not be empty")
        given = {**(config or {}), **{k.replace("_", "."): v for k, v in kwargs.items()}}
        if given.get("enable.idempotence") is not None and not out["enable.idempotence"]:
            raise ConfigError("transactional.id requires enable.idempotence=true")
        out["enable.idempotence"] = True     # implied, as in Kafka
    if out["enable.idempotence"]:
        if out["acks"] != -1:
            raise ConfigError("enable.idempotence requires acks=all")
        if out["max.in.flight.requests.per.connection"] > 5:
            raise ConfigError("enable.idempotence requires max.in.flight.requests.per.connection <= 5")
        if out["retries"] == 0:
            raise ConfigError("enable.idempotence requires retries > 0")
    if out["delivery.timeout.ms"] < out["linger.ms"] + out["request.timeout.ms"]:
        raise ConfigError("delivery.timeout.ms should be >= linger.ms + request.timeout.ms")
    return out


def consumer_config(config: dict | None = None, **kwargs) -> dict:
    out = build(CONSUMER, config, kwargs)
    if out["enable.auto.commit"]:
        raise ConfigError("enable.auto.commit: offset commit comes with group membership; leave it false")
    return out
