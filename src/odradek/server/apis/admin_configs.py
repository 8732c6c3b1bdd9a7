"""Configs: DescribeConfigs (32), AlterConfigs (33) and IncrementalAlterConfigs (44, KIP-339).
Seed 003, "DescribeConfigs API" and "AlterConfigs API".

Resources: topics (2), brokers (4) and broker loggers (8). A broker resource is this broker's id
(its effective config, or its dynamic per-broker layer when altered) or "" (the cluster-wide dynamic
default layer). Topic overrides live in `/config/topics/<topic>`, dynamic broker layers in
`/config/brokers/<id>` and `/config/brokers/<default>`; a change takes effect at once, without a
restart (through the controller channel, `ctx.controller`); in a cluster on ZooKeeper the write comes
with a change notification under `/config/changes` and every other broker applies it too
(`cluster/config_changes.py`). Broker loggers are the broker
process's Python loggers, with Log4j's level names (TRACE, DEBUG, INFO, WARN, ERROR, FATAL); as in
Kafka their levels are not persisted.

Checks and messages follow Kafka's broker (ConfigHelper, ConfigAdminManager) and controller
(ConfigurationControlManager, ControllerConfigurationValidator): AlterConfigs replaces the whole set of
a resource, IncrementalAlterConfigs applies SET / DELETE / APPEND / SUBTRACT per key (APPEND and
SUBTRACT only on LIST configs, starting from the key's default when it is not set); a bad topic config
is INVALID_CONFIG, a bad broker change INVALID_REQUEST (KAFKA-13609 keeps that code for
compatibility). Every change is checked whole before it is stored, validate_only or not: the topic's
config must build its logs' config, and a broker layer must leave every topic that inherits it able
to (issue 26: a value stored but not applicable stopped the broker for good). Group (32) and client-metrics (16) resources are not served yet: INVALID_REQUEST.

Better than Kafka: DescribeConfigs v0 fills `is_default` (Kafka 2.0+ leaves it false for every
config), unknown resource types fail their own resource rather than the whole request, and APPEND or
SUBTRACT on an unknown broker key is INVALID_CONFIG rather than an unknown server error.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn

from odradek.cluster.topics import validate_topic_name
from odradek.protocol.error_codes import ErrorCode, KafkaApiError
from odradek.protocol.messages import alter_configs as ac
from odradek.protocol.messages import describe_configs as dc
from odradek.protocol.messages import incremental_alter_configs as iac
from odradek.server.config import ConfigEntry, ConfigError, ConfigSource, ConfigType, TopicConfig, value_to_string
from odradek.server.config_reconfigure import check_topics_under, validate_reconfiguration
from odradek.server.config_defs import BROKER_CONFIGS, TOPIC_CONFIGS, ConfigKey
from odradek.server.context import RequestContext

TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
RESOURCE_TYPES = {0: "UNKNOWN", 2: "TOPIC", 4: "BROKER", 8: "BROKER_LOGGER", 16: "CLIENT_METRICS", 32: "GROUP"}
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
OPERATIONS = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}
_INTEGER = re.compile(r"[+-]?[0-9]+")


def _fail(code: ErrorCode, message: str | None = None) -> NoReturn:
    raise KafkaApiError(code, message)


def _node_id(name: str, what: str = "Node id") -> int:
    if not _INTEGER.fullmatch(name or ""):
        _fail(ErrorCode.INVALID_REQUEST, f"{what} must be an integer, but it is: {name}")
    return int(name)


# ------------------------------------------------------------------------------------------ broker loggers
ROOT_LOGGER = "root"
_LEVELS = {"TRACE": 5, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
_LEVEL_NAMES = {v: k for k, v in _LEVELS.items()}


def _python_logger(name: str) -> logging.Logger | None:
    if name == ROOT_LOGGER:
        return logging.getLogger()
    found = logging.Logger.manager.loggerDict.get(name)
    return found if isinstance(found, logging.Logger) else None


def _level_name(level: int) -> str:
    return _LEVEL_NAMES.get(level) or next((n for lv, n in sorted(_LEVEL_NAMES.items()) if lv >= level), "FATAL")


def broker_loggers() -> dict[str, str]:
    """Every logger of the process and its effective level (Log4jController.loggers)."""
    out = {ROOT_LOGGER: _level_name(logging.getLogger().level)}
    for name, lg in sorted(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger):
            out[name] = _level_name(lg.getEffectiveLevel())
    return out


def _alter_loggers(ctx: RequestContext, resource: iac.AlterConfigsResource, validate_only: bool) -> None:
    """RuntimeLoggerManager: validate every operation, then apply them all."""
    if _node_id(resource.resource_name) != ctx.broker_id:
        _fail(ErrorCode.INVALID_REQUEST, f"Unexpected node id. Expected {ctx.broker_id}, "
                                         f"but received {resource.resource_name}")
    for c in resource.configs:
        op = c.config_operation
        if op in (SET, DELETE) and _python_logger(c.name) is None:
            _fail(ErrorCode.INVALID_CONFIG, f"Logger {c.name} does not exist!")
        if op == SET and c.value not in _LEVELS:
            _fail(ErrorCode.INVALID_CONFIG, f"Cannot set the log level of {c.name} to {c.value} as it is not a "
                                            f"supported log level. Valid log levels are {', '.join(sorted(_LEVELS))}")
        if op == DELETE and c.name == ROOT_LOGGER:
            _fail(ErrorCode.INVALID_REQUEST, f"Removing the log level of the {ROOT_LOGGER} logger is not allowed")
        if op in (APPEND, SUBTRACT):
            _fail(ErrorCode.INVALID_REQUEST,
                  f"{OPERATIONS[op]} operation is not allowed for the BROKER_LOGGER resource")
        if op not in OPERATIONS:
            _fail(ErrorCode.INVALID_REQUEST,
                  f"Unknown operation type {op} is not allowed for the BROKER_LOGGER resource")
    if validate_only:
        return
    for c in resource.configs:
        lg = _python_logger(c.name)
        assert lg is not None   # checked above
        lg.setLevel(_LEVELS[c.value] if c.config_operation == SET else logging.NOTSET)
        logging.getLogger("odradek.admin").warning("Updated the log level of %s to %s", c.name,
                                                   c.value if c.config_operation == SET else "its parent's")


# ------------------------------------------------------------------------------------------ DescribeConfigs
def _wire_entry(entry: ConfigEntry, resource_type: int, synonyms: bool, docs: bool) -> dc.DescribeConfigsResourceResult:
    is_default = entry.source == ConfigSource.DEFAULT_CONFIG if resource_type == BROKER \
        else entry.source != ConfigSource.TOPIC_CONFIG
    return dc.DescribeConfigsResourceResult(
        name=entry.name, value=None if entry.sensitive else entry.value_string, read_only=entry.read_only,
        config_source=int(entry.source), is_default=is_default, is_sensitive=entry.sensitive,
        synonyms=[dc.DescribeConfigsSynonym(name=s.name, value=s.value, source=int(s.source))
                  for s in entry.synonyms] if synonyms else [],
        config_type=int(entry.type), documentation=entry.documentation if docs else None)


def _wanted(resource: dc.DescribeConfigsResource, names: Iterable[str]) -> list[str]:
    keys = resource.configuration_keys
    if not keys:
        return list(names)
    return [n for n in names if n in set(keys)]


def _describe(ctx: RequestContext, resource: dc.DescribeConfigsResource, synonyms: bool, docs: bool) -> list:
    kind, name = resource.resource_type, resource.resource_name
    if kind == TOPIC:
        reason = validate_topic_name(name)
        if reason is not None:
            _fail(ErrorCode.INVALID_TOPIC_EXCEPTION, reason)
        if ctx.metadata.topic(name) is None:
            _fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        tc = ctx.metadata.topic_config(name)
        return [_wire_entry(e, TOPIC, synonyms, docs) for e in tc.describe(_wanted(resource, sorted(tc)))]
    if kind == BROKER:
        config = ctx.config
        if not name:  # the cluster-wide dynamic default layer, and only what it sets
            layer = config.dynamic_default
            out = []
            for e in config.describe(_wanted(resource, sorted(layer))):
                chain = tuple(s for s in e.synonyms if s.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
                e = replace(e, value_string=None if e.sensitive else layer[e.name], synonyms=chain,
                            source=chain[0].source if chain else ConfigSource.DEFAULT_CONFIG)
                out.append(_wire_entry(e, BROKER, synonyms, docs))
            return out
        if _node_id(name, "Broker id") != ctx.broker_id:
            _fail(ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {ctx.broker_id} or empty string, "
                                             f"but received {name}")
        return [_wire_entry(e, BROKER, synonyms, docs)
                for e in config.describe(_wanted(resource, sorted(BROKER_CONFIGS)))]
    if kind == BROKER_LOGGER:
        if not name:
            _fail(ErrorCode.INVALID_REQUEST, "Broker id must not be empty")
        if _node_id(name, "Broker id") != ctx.broker_id:
            _fail(ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {ctx.broker_id} but received {name}")
        loggers = broker_loggers()
        return [dc.DescribeConfigsResourceResult(
            name=n, value=loggers[n], read_only=False, config_source=int(ConfigSource.DYNAMIC_BROKER_LOGGER_CONFIG),
            is_default=False, is_sensitive=False, synonyms=[], config_type=int(ConfigType.UNKNOWN),
            documentation=None) for n in _wanted(resource, loggers)]
    _fail(ErrorCode.INVALID_REQUEST, f"Unsupported resource type: {RESOURCE_TYPES.get(kind, 'UNKNOWN')}")


async def handle_describe_configs(ctx: RequestContext, request: dc.DescribeConfigsRequest) -> dc.DescribeConfigsResponse:
    v = ctx.api_version
    synonyms = v >= 1 and request.include_synonyms
    docs = v >= 3 and request.include_documentation
    results = []
    for r in request.resources:
        try:
            configs = _describe(ctx, r, synonyms, docs)
            results.append(dc.DescribeConfigsResult(error_code=ErrorCode.NONE, error_message=None,
                                                    resource_type=r.resource_type, resource_name=r.resource_name,
                                                    configs=configs))
        except KafkaApiError as e:
            results.append(dc.DescribeConfigsResult(error_code=e.code, error_message=e.detail,
                                                    resource_type=r.resource_type, resource_name=r.resource_name,
                                                    configs=[]))
    return dc.DescribeConfigsResponse(throttle_time_ms=0, results=results)


# ------------------------------------------------------------------------------------------ changes
def _precheck(resource: ac.AlterConfigsResource | iac.AlterConfigsResource, duplicated: set[tuple[int, str]],
              incremental: bool) -> None:
    """ConfigAdminManager.preprocess: one entry per resource and per key, values present (but DELETE)."""
    if (resource.resource_type, resource.resource_name) in duplicated:
        _fail(ErrorCode.INVALID_REQUEST, "Each resource must appear at most once.")
    names = [c.name for c in resource.configs]
    if len(names) != len(set(names)):
        _fail(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    nulls = [c.name for c in resource.configs
             if c.value is None and not (incremental and c.config_operation == DELETE)]
    if nulls:
        _fail(ErrorCode.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}")


def _duplicated(resources: Sequence[ac.AlterConfigsResource | iac.AlterConfigsResource]) -> set[tuple[int, str]]:
    seen: set[tuple[int, str]] = set()
    dup: set[tuple[int, str]] = set()
    for r in resources:
        key = (r.resource_type, r.resource_name)
        (dup if key in seen else seen).add(key)
    return dup


async def _change_topic(ctx: RequestContext, name: str, overrides: dict[str, str], validate_only: bool) -> None:
    """ControllerConfigurationValidator, then the existence check, then the change."""
    if not name:
        _fail(ErrorCode.INVALID_REQUEST, "Default topic resources are not allowed.")
    reason = validate_topic_name(name)
    if reason is not None:
        _fail(ErrorCode.INVALID_TOPIC_EXCEPTION, reason)
    try:
        TopicConfig.resolve(overrides, ctx.config)
    except ConfigError as e:
        _fail(ErrorCode.INVALID_CONFIG, str(e))
    if ctx.metadata.topic(name) is None:
        _fail(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
    if not validate_only:
        await ctx.controller.set_topic_configs(name, overrides)


def _broker_layer(ctx: RequestContext, name: str) -> bool:
    """True for this broker's own layer, False for the cluster default ("")."""
    if name and _node_id(name) != ctx.broker_id:
        _fail(ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {ctx.broker_id}, but received {name}")
    return bool(name)


async def _change_broker(ctx: RequestContext, per_broker: bool, layer: dict[str, str], validate_only: bool) -> None:
    """The new layer is checked whole before anything is stored (validate_only too): its values, Kafka's
    limits on changing a running broker, and the config of every topic that inherits it."""
    kwargs = {"per_broker": layer} if per_broker else {"default": layer}
    old = ctx.config
    try:
        new = old.with_dynamic(**{("dynamic_broker" if per_broker else "dynamic_default"): layer})
        validate_reconfiguration(old, new)
        # grows with the topics that override log keys (2,000 distinct ones: about 0.3 s): off the loop
        topics = [(t.name, t.configs) for t in ctx.metadata.image.topics.values()]
        await ctx.workers.run(check_topics_under, old, new, topics)
    except ConfigError as e:
        _fail(ErrorCode.INVALID_REQUEST, str(e))
    if not validate_only:
        await ctx.controller.set_dynamic_broker_configs(**kwargs)


async def handle_alter_configs(ctx: RequestContext, request: ac.AlterConfigsRequest) -> ac.AlterConfigsResponse:
    duplicated = _duplicated(request.resources)
    responses = []
    for r in request.resources:
        code, message = ErrorCode.NONE, None
        try:
            _precheck(r, duplicated, incremental=False)
            new = {c.name: c.value for c in r.configs}
            if r.resource_type == BROKER:
                await _change_broker(ctx, _broker_layer(ctx, r.resource_name), new, request.validate_only)
            elif r.resource_type == TOPIC:
                await _change_topic(ctx, r.resource_name, new, request.validate_only)
            else:
                _fail(ErrorCode.INVALID_REQUEST, f"Unknown resource type {r.resource_type}")
        except KafkaApiError as e:
            code, message = e.code, e.detail
        responses.append(ac.AlterConfigsResourceResponse(error_code=code, error_message=message,
                                                         resource_type=r.resource_type, resource_name=r.resource_name))
    return ac.AlterConfigsResponse(throttle_time_ms=0, responses=responses)


def _list_default(key: ConfigKey | None) -> str:
    return (value_to_string(key.type, key.default) or "") if key is not None else ""


def _apply_ops(current: Mapping[str, str], configs: list[iac.AlterableConfig], keys: Mapping[str, ConfigKey],
               topic: bool) -> dict[str, str]:
    """The new set of values after SET / DELETE / APPEND / SUBTRACT (a list starts from its default)."""
    out = dict(current)
    for c in configs:
        op = c.config_operation
        if op == SET:
            out[c.name] = c.value
        elif op == DELETE:
            out.pop(c.name, None)
        elif op in (APPEND, SUBTRACT):
            key = keys.get(c.name)
            if key is None or key.type is not ConfigType.LIST:
                if topic:
                    _fail(ErrorCode.INVALID_CONFIG,
                          f"Can't {OPERATIONS[op]} to key {c.name} because its type is not LIST.")
                if key is None:
                    _fail(ErrorCode.INVALID_CONFIG, f"Unknown config name: {c.name}")
                _fail(ErrorCode.INVALID_CONFIG, f"Config value {OPERATIONS[op].lower()} is not allowed for config "
                                                f"key: {c.name}")
            old = out[c.name] if c.name in out else _list_default(key)
            items = [s for s in old.split(",") if s]
            if op == APPEND:
                items += [s for s in c.value.split(",") if s not in items]
            else:
                drop = c.value.split(",")
                items = [s for s in items if s not in drop]
            out[c.name] = ",".join(items)
        else:
            _fail(ErrorCode.INVALID_REQUEST, f"Unknown operations type {op}")
    return out


async def handle_incremental_alter_configs(ctx: RequestContext, request: iac.IncrementalAlterConfigsRequest
                                           ) -> iac.IncrementalAlterConfigsResponse:
    duplicated = _duplicated(request.resources)
    responses = []
    for r in request.resources:
        code, message = ErrorCode.NONE, None
        try:
            _precheck(r, duplicated, incremental=True)
            if r.resource_type == BROKER_LOGGER:
                _alter_loggers(ctx, r, request.validate_only)
            elif r.resource_type == BROKER:
                per_broker = _broker_layer(ctx, r.resource_name)
                current = ctx.config.dynamic_broker if per_broker else ctx.config.dynamic_default
                layer = _apply_ops(current, r.configs, BROKER_CONFIGS, topic=False)
                await _change_broker(ctx, per_broker, layer, request.validate_only)
            elif r.resource_type == TOPIC:
                info = ctx.metadata.topic(r.resource_name) if validate_topic_name(r.resource_name) is None else None
                overrides = _apply_ops(info.configs if info else {}, r.configs, TOPIC_CONFIGS, topic=True)
                await _change_topic(ctx, r.resource_name, overrides, request.validate_only)
            else:
                _fail(ErrorCode.INVALID_REQUEST, f"Unknown resource type {r.resource_type}")
        except KafkaApiError as e:
            code, message = e.code, e.detail
        responses.append(iac.AlterConfigsResourceResponse(error_code=code, error_message=message,
                                                          resource_type=r.resource_type, resource_name=r.resource_name))
    return iac.IncrementalAlterConfigsResponse(throttle_time_ms=0, responses=responses)
