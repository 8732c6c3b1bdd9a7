"""Checks of a dynamic broker config change against the running broker, before it is stored
(issue 26): Kafka's limits on changing thread counts (DynamicThreadPool, the acceptor's
num.network.threads, LogCleaner.validateReconfiguration), and the config of every topic that inherits
the change, which must still build its logs' `LogConfig`.

These are checks of a change, not of a config: a stored layer read at start is not held to them (a
thread count doubled twice in two changes still loads), see `BrokerConfig.with_stored_dynamic`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from odradek.server.config import LOG_CONFIG_KEYS, BrokerConfig, ConfigError, TopicConfig, parse_value, value_to_string
from odradek.server.config_defs import TOPIC_CONFIGS
from odradek.storage.config import LogConfig, LogConfigError

_LOG_KEY_SET = frozenset(LOG_CONFIG_KEYS)

# Kafka's DynamicThreadPool and the acceptor's num.network.threads: a running broker's thread count
# changes at most by half or double at a time, and never below 1; log.cleaner.threads likewise
# (LogCleaner.validateReconfiguration), which also keeps a request from starting 2**31 cleaner threads.
THREAD_COUNT_KEYS = ("num.io.threads", "num.network.threads", "num.replica.fetchers",
                     "num.recovery.threads.per.data.dir", "background.threads")


def validate_reconfiguration(old: BrokerConfig, new: BrokerConfig) -> None:
    """The checks Kafka makes of a dynamic change against the running values (not of stored layers
    at start: a count doubled twice is fine). Raises ConfigError with Kafka's messages."""
    for name in THREAD_COUNT_KEYS:
        before, after = old.get(name), new.get(name)
        if after == before:
            continue
        failed = f"Dynamic thread count update validation failed for {name}={after}"
        if after <= 0:
            raise ConfigError(name, after, "", message=f"{failed}, value should be at least 1")
        if after < before // 2:
            raise ConfigError(name, after, "", message=f"{failed}, value should be at least half the current "
                                                       f"value {before}")
        if after > before * 2:
            raise ConfigError(name, after, "", message=f"{failed}, value should not be greater than double the "
                                                       f"current value {before}")
    _validate_cleaner_threads(old.get("log.cleaner.threads"), new.get("log.cleaner.threads"))


def _validate_cleaner_threads(before: int, after: int) -> None:
    """Kafka's LogCleaner.validateReconfiguration, when the count changes (Kafka checks it on a change
    of any cleaner key, which refuses every such change on a broker started with no cleaner threads)."""
    if after == before:
        return
    if after < 1:
        raise ConfigError("log.cleaner.threads", after, "", message="Log cleaner threads should be at least 1")
    if after < before // 2:
        raise ConfigError("log.cleaner.threads", after, "", message="Log cleaner threads cannot be reduced to less "
                                                                    f"than half the current value {before}")
    if after > before * 2:
        raise ConfigError("log.cleaner.threads", after, "", message="Log cleaner threads cannot be increased to "
                                                                    f"more than double the current value {before}")


def check_topics_under(old: BrokerConfig, new: BrokerConfig, topics: Iterable[tuple[str, Mapping[str, str]]]) -> None:
    """Every topic that inherits a broker config change must still build its logs' config: raises
    ConfigError naming the first topic that would not. Topics are told apart only by their overrides
    of the log keys (most have none), and a topic whose stored overrides already fail under the running
    config is skipped (it is served with those values left out)."""
    defaults = {n: TopicConfig.resolve({}, config) for n, config in (("new", new), ("old", old))}
    seen: set[frozenset[tuple[str, str]]] = set()
    for name, overrides in topics:
        own = {k: v for k, v in overrides.items() if k in _LOG_KEY_SET and v is not None}
        key = frozenset(own.items())
        if key in seen:
            continue
        seen.add(key)
        try:
            _log_config_with(defaults["new"], own)
        except ConfigError as e:
            try:
                _log_config_with(defaults["old"], own)
            except ConfigError:
                continue
            raise ConfigError(e.key, e.value, e.reason,
                              message=f"The change would leave topic {name} with a config its logs cannot "
                                      f"take: {e.detail}") from None


def _log_config_with(defaults: TopicConfig, overrides: Mapping[str, str]) -> LogConfig:
    """The logs' config of a topic with these overrides of log keys over a resolved default."""
    props = {name: value for name in LOG_CONFIG_KEYS if (value := defaults[name].value_string) is not None}
    for name, raw in overrides.items():
        key = TOPIC_CONFIGS[name]
        props[name] = value_to_string(key.type, parse_value(key, raw)) or ""
    try:
        return LogConfig().from_properties(props)
    except LogConfigError as e:
        raise ConfigError(e.name, e.value, e.reason) from None
