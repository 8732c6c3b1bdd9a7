"""One set of validators (issue 26): whatever the config definitions accept the storage layer applies,
Kafka's limits on changing a running broker, and stored values read leniently at start."""

from __future__ import annotations

import logging

import pytest

import odradek.server.config_reconfigure as reconfigure_module
from odradek.server.config import BrokerConfig, ConfigError, TopicConfig
from odradek.server.config_reconfigure import check_topics_under, validate_reconfiguration
from odradek.server.config_defs import (
    BROKER_CONFIGS,
    DOUBLE,
    INT,
    LONG,
    SHORT,
    TOPIC_CONFIG_SYNONYMS,
    TOPIC_CONFIGS,
    accepted_range,
)
from odradek.storage.config import LogConfig, LogConfigError

NUMERIC = (INT, SHORT, LONG, DOUBLE)


def hostile_values(key) -> list[str]:
    """Boundary and hostile values of a key, as strings: min-1, min, max, max+1, negatives, 0, huge,
    not a number, empty."""
    values = ["", "x", " ", "1.5", "-", "0x10", "9" * 30, "-" + "9" * 30]
    if key.type in NUMERIC:
        low, high = accepted_range(key)
        if key.type is DOUBLE:
            values += [repr(v) for v in (low, high, 0.0, -1.0, 1.0, 0.5, 1e308, -0.001, 1.001)] + ["NaN", "1e400"]
        else:
            values += [str(v) for v in {low - 1, low, low + 1, high - 1, high, high + 1, -5, -2, -1, 0, 1, 4, 11}]
    return values


@pytest.mark.parametrize("name", sorted(TOPIC_CONFIGS))
def test_a_topic_value_the_definitions_accept_builds_the_log_config(name):
    broker = BrokerConfig({})
    accepted = 0
    for value in hostile_values(TOPIC_CONFIGS[name]):
        try:
            tc = TopicConfig.resolve({name: value}, broker)
        except ConfigError:
            continue
        accepted += 1
        assert isinstance(tc.log_config, LogConfig)
    assert accepted or TOPIC_CONFIGS[name].type not in NUMERIC


@pytest.mark.parametrize("name", sorted({s.name for group in TOPIC_CONFIG_SYNONYMS.values() for s in group
                                         if BROKER_CONFIGS[s.name].dynamic}))
def test_a_broker_default_the_definitions_accept_builds_every_log_config(name):
    broker = BrokerConfig({})
    for value in hostile_values(BROKER_CONFIGS[name]):
        for layer in ("dynamic_default", "dynamic_broker"):
            try:
                new = broker.with_dynamic(**{layer: {name: value}})
            except ConfigError:
                continue
            assert isinstance(TopicConfig.resolve({}, new).log_config, LogConfig)
            assert isinstance(TopicConfig.resolve({"segment.ms": "1000"}, new).log_config, LogConfig)


@pytest.mark.parametrize("layer, effective", [
    ({"log.retention.bytes": "-5"}, ("retention_bytes", -5)),
    ({"log.index.size.max.bytes": "4"}, ("segment_index_bytes", 4)),
    ({"log.index.size.max.bytes": "11"}, ("segment_index_bytes", 11)),
    ({"log.retention.ms": "-2"}, ("retention_ms", -1)),
])
def test_the_issues_values_are_accepted_with_kafkas_meaning(layer, effective):
    new = BrokerConfig({}).with_dynamic(dynamic_default=layer)
    field, value = effective
    assert getattr(TopicConfig.resolve({}, new).log_config, field) == value
    assert TopicConfig.resolve({}, BrokerConfig({"log.retention.hours": "-3"})).log_config.retention_ms == -1


@pytest.mark.parametrize("layer, key", [
    ({"num.replica.fetchers": "0"}, "num.replica.fetchers"),
    ({"log.roll.ms": "0"}, "log.roll.ms"),
    ({"log.roll.jitter.ms": "-1"}, "log.roll.jitter.ms"),
    ({"log.flush.interval.ms": "-3"}, "log.flush.interval.ms"),
    ({"log.retention.ms": "0"}, "log.retention.ms"),
    ({"log.index.size.max.bytes": "3"}, "log.index.size.max.bytes"),
])
def test_a_broker_value_no_log_could_take_is_refused_by_its_own_name(layer, key):
    with pytest.raises(ConfigError) as e:
        BrokerConfig({}).with_dynamic(dynamic_default=layer)
    assert e.value.key == key


def test_a_static_value_no_log_could_take_names_the_key_set():
    with pytest.raises(ConfigError) as e:
        BrokerConfig({"log.retention.hours": "5", "log.retention.minutes": "0"})
    assert e.value.key == "log.retention.minutes"


def test_topic_values_refused_name_the_key():
    for overrides in ({"retention.ms": "-2"}, {"segment.index.bytes": "3"}, {"min.cleanable.dirty.ratio": "NaN"},
                      {"cleanup.policy": "delete,shred"}, {"segment.bytes": "1048575"}):
        with pytest.raises(ConfigError) as e:
            TopicConfig.resolve(overrides, BrokerConfig({}))
        assert e.value.key == next(iter(overrides))


# --- Kafka's limits on a running broker's thread counts -------------------------------------------


@pytest.mark.parametrize("name", ["num.io.threads", "num.network.threads", "num.replica.fetchers",
                                  "num.recovery.threads.per.data.dir", "background.threads"])
def test_thread_counts_change_by_at_most_half_or_double(name):
    old = BrokerConfig({name: "4"})
    for value, ok in (("2", True), ("8", True), ("4", True), ("1", False), ("9", False)):
        new = old.with_dynamic(dynamic_default={name: value})
        if ok:
            validate_reconfiguration(old, new)
        else:
            with pytest.raises(ConfigError, match="Dynamic thread count update validation failed"):
                validate_reconfiguration(old, new)
    # a stored layer is not a change: a count doubled twice still loads
    assert BrokerConfig({name: "4"}).with_stored_dynamic(dynamic_default={name: "16"}).get(name) == 16


def test_cleaner_threads_follow_kafkas_log_cleaner_rule():
    old = BrokerConfig({"log.cleaner.threads": "2"})
    for value, message in (("0", "at least 1"), ("5", "more than double the current value 2"),
                           (str(2**31 - 1), "more than double")):
        with pytest.raises(ConfigError, match=message):
            validate_reconfiguration(old, old.with_dynamic(dynamic_default={"log.cleaner.threads": value}))
    validate_reconfiguration(old, old.with_dynamic(dynamic_default={"log.cleaner.threads": "4"}))
    low = BrokerConfig({"log.cleaner.threads": "8"})
    with pytest.raises(ConfigError, match="less than half the current value 8"):
        validate_reconfiguration(low, low.with_dynamic(dynamic_default={"log.cleaner.threads": "3"}))


# --- stored values are read leniently ----------------------------------------------------------------


def test_a_stored_broker_value_that_cannot_apply_is_logged_once_and_defaults(caplog):
    static = BrokerConfig({"log.retention.hours": "5"})
    with caplog.at_level(logging.WARNING, logger="odradek.config"):
        config = static.with_stored_dynamic(
            dynamic_default={"num.replica.fetchers": "0", "log.retention.bytes": "7", "log.roll.ms": "-1"},
            dynamic_broker={"log.index.size.max.bytes": "3", "log.cleaner.threads": "2", "listeners": "bad"})
    assert config.get("num.replica.fetchers") == 1 and config.get("log.roll.ms") == 168 * 3_600_000
    assert config.get("log.index.size.max.bytes") == 10485760
    assert (config.get("log.retention.bytes"), config.get("log.cleaner.threads")) == (7, 2)
    assert config.dynamic_default == {"log.retention.bytes": "7"}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4
    for key, value, entity in (("num.replica.fetchers", "'0'", "the cluster default broker"),
                               ("log.roll.ms", "'-1'", "the cluster default broker"),
                               ("log.index.size.max.bytes", "'3'", "broker 0"),
                               ("listeners", "'bad'", "broker 0")):
        (line,) = [line for line in lines if f" {key}=" in line]
        assert value in line and entity in line and "default applies" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="odradek.config"):
        static.with_stored_dynamic(dynamic_default={"num.replica.fetchers": "0"})
    assert not caplog.records        # once per stored value


def test_a_stored_topic_override_that_cannot_apply_is_logged_and_left_out(caplog):
    with caplog.at_level(logging.WARNING, logger="odradek.config"):
        tc = TopicConfig.resolve_stored({"retention.ms": "-7", "segment.index.bytes": "2", "retention.bytes": "-5",
                                         "no.such.key": "1"}, BrokerConfig({}), "orders")
    assert tc.log_config.retention_ms == 604800000 and tc.log_config.segment_index_bytes == 10485760
    assert tc.log_config.retention_bytes == -5
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("topic orders" in line for line in lines)
    assert any("retention.ms='-7'" in line and "at least -1" in line for line in lines)


def test_stored_secrets_are_not_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="odradek.config"):
        BrokerConfig({}).with_stored_dynamic(dynamic_default={"ssl.keystore.password": "hunter2",
                                                              "ssl.keystore.key": "-----BEGIN hunter3"})
    assert len(caplog.records) == 2 and "hunter" not in caplog.text


# --- a broker change is checked against every topic that inherits it ------------------------------


def test_a_broker_change_that_would_break_a_topic_is_refused(monkeypatch):
    """No rule of a log relates two keys today; this one, put in place of the storage layer's, shows
    that a broker change is checked with each topic's own overrides, and that a topic whose stored
    overrides already fail does not block a change."""
    class Strict(LogConfig):
        def from_properties(self, props):
            if props.get("retention.bytes") == "123" and props.get("segment.ms") == "1000":
                raise LogConfigError("retention.bytes", 123, "not with segment.ms 1000")
            return super().from_properties(props)

    monkeypatch.setattr(reconfigure_module, "LogConfig", Strict)
    old = BrokerConfig({})
    new = old.with_dynamic(dynamic_default={"log.retention.bytes": "123"})
    check_topics_under(old, new, [("a", {}), ("b", {"segment.ms": "2000"}), ("broken", {"retention.ms": "-9"})])
    with pytest.raises(ConfigError, match="topic c"):
        check_topics_under(old, new, [("a", {}), ("c", {"segment.ms": "1000"})])


# --- the broker-wide storage settings ---------------------------------------------------------------

LOG_MANAGER_KEYS = ("log.retention.check.interval.ms", "log.flush.offset.checkpoint.interval.ms",
                    "log.flush.start.offset.checkpoint.interval.ms", "replica.high.watermark.checkpoint.interval.ms",
                    "replica.alter.log.dirs.io.max.bytes.per.second", "alter.log.dirs.replication.quota.window.num",
                    "alter.log.dirs.replication.quota.window.size.seconds", "log.drop.behind.bytes",
                    *(name for name in BROKER_CONFIGS if name.startswith("log.cleaner.")))


@pytest.mark.parametrize("name", LOG_MANAGER_KEYS)
def test_a_broker_value_the_definitions_accept_builds_the_log_manager_config(name, tmp_path):
    """Static or dynamic, a value BrokerConfig takes never fails the storage layer's own checks at start
    (0 and negative checkpoint intervals mean no periodic checkpoint, as Kafka's scheduler reads them)."""
    from odradek.server.broker import log_manager_config

    for value in hostile_values(BROKER_CONFIGS[name]):
        try:
            config = BrokerConfig({"log.dirs": str(tmp_path), name: value})
        except ConfigError:
            continue
        log_manager_config(config, LogConfig())
