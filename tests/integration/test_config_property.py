"""The config property test of issue 26: every topic config key and every dynamically alterable broker
config key, set through real clients to boundary and hostile values (min-1, min, max, max+1, negatives,
0, huge, not a number, empty, members outside an enum or list), on one broker.

For every value: an accepted one applies at once (DescribeConfigs shows it), a refused one answers
INVALID_CONFIG (a topic) or INVALID_REQUEST (a broker resource, Kafka's code there) and changes
nothing, and the broker never closes the connection. Where the definitions give a numeric range, the
answer must follow it. At the end of each case (a batch of keys, to keep restarts few) the broker is
restarted and every accepted value must still be in effect.

Topic keys go one key per topic (a key's values never meet another key's cross checks); cluster-level
broker keys go to the cluster default (""), per-broker ones to broker 0. A few keys decide how clients
reach the broker (listeners, connection limits): they are set to a harmless value last, so the restart
shows that one persisted.
"""

from __future__ import annotations

import re
import time

import kafka.errors as kerr
import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import DescribeConfigsRequest, IncrementalAlterConfigsRequest

from odradek.server.config_defs import (
    BOOLEAN,
    BROKER_CONFIGS,
    DOUBLE,
    LIST,
    PASSWORD,
    PER_BROKER_CONFIGS,
    TOPIC_CONFIGS,
    AtLeast,
    Between,
    ListOf,
    OneOf,
    accepted_range,
)

from .clients import Msg, confluent_config, confluent_consumer, produce_confluent

INTEGER = re.compile(r"[+-]?[0-9]+")
DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
INVALID_CONFIG = KafkaError.INVALID_CONFIG
INVALID_REQUEST = kerr.InvalidRequestError.errno
NOT_A_NUMBER = ["", " ", "x", "0x10", "1.5", "9" * 30, "-" + "9" * 30, "\u00e9\u0000"]

# Keys whose value decides whether clients can reach the broker after the restart: after their hostile
# values (whose answers are checked like any other) the last value set is one that keeps it reachable.
def _harmless(port: int) -> dict[str, str]:
    return {"listeners": f"PLAINTEXT://127.0.0.1:{port}", "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL", "max.connections": "1000",
            "max.connections.per.ip": "1000", "max.connection.creation.rate": "1000",
            "max.connections.per.ip.overrides": "127.0.0.2:5"}


# Broker keys whose answer depends on more than the key's own range: the running value (Kafka's
# half/double rule for thread counts), another key, or the topic key the value is a default of.
NO_RANGE_ORACLE = {"num.io.threads", "num.network.threads", "num.replica.fetchers", "background.threads",
                   "num.recovery.threads.per.data.dir", "log.cleaner.threads", "max.connections.per.ip"}


def values_for(key) -> list[str]:
    validator = key.validator
    if key.type is BOOLEAN:
        return ["true", "TRUE", "yes", "1", "", "false", "False"]
    if key.type is DOUBLE:
        low, high = accepted_range(key)
        numbers = {low, high, -1.0, 0.0, 0.5, 1.0, 0.001, 1.001, 1e308}
        return NOT_A_NUMBER + ["NaN", "1e400", "-1e-3"] + [repr(n) for n in sorted(numbers)]
    if key.type in (LIST,) and isinstance(validator, ListOf):
        choices = list(validator.choices)
        return ["nope", f"{choices[0]},nope", "", ",".join(choices), choices[0].upper(), *choices]
    if isinstance(validator, OneOf):
        choices = list(validator.choices)
        return ["nope", "", choices[0].upper(), " " + choices[-1], *choices]
    if key.type is PASSWORD:
        return ["", "secret"]
    if key.type in (LIST,):
        return ["", "a,b", " a , b ", "x" * 5000, "a"]
    if key.type.name in ("INT", "SHORT", "LONG"):
        low, high = accepted_range(key)
        numbers = {low - 1, low, low + 1, high, high + 1, -5, -2, -1, 0, 1, 4, 11, 12}
        return NOT_A_NUMBER + [str(n) for n in sorted(numbers)]
    return ["", "x", "y" * 5000, "PLAINTEXT://:1", "a:b,c", "value"]


def expected_answer(key, raw: str, broker: bool) -> bool | None:
    """True: must be accepted; False: must be refused; None: no oracle beyond the property itself."""
    if key.name in NO_RANGE_ORACLE or not (key.validator is None or isinstance(key.validator, (AtLeast, Between))):
        return None
    text = raw.strip()
    if key.type.name in ("INT", "SHORT", "LONG"):
        if not INTEGER.fullmatch(text):
            return False
        low, high = accepted_range(key)
        inside = low <= int(text) <= high
        if broker and key.validator is None:
            return False if not inside else None     # checked through the topic key it gives a default to
        return inside
    if key.type is DOUBLE and DECIMAL.fullmatch(text) and text not in ("1e400",):
        low, high = accepted_range(key)
        return low <= float(text) <= high
    return None


def same(key, described: str | None, raw: str) -> bool:
    if key.type is PASSWORD:
        return True
    if described is None:
        return False
    text = raw.strip()
    if key.type.name in ("INT", "SHORT", "LONG"):
        return int(described) == int(text)
    if key.type is DOUBLE:
        return float(described) == float(text.rstrip("dDfF"))
    if key.type is BOOLEAN:
        return described == text.lower()
    if key.type is LIST:
        return described == ",".join(p.strip() for p in text.split(",")) if text else described == ""
    return described == text


# ------------------------------------------------------------------------------------------ clients
def kp_send(kadmin: KafkaAdminClient, request):
    async def call():
        return await kadmin._manager.send(request, node_id=0)
    return kadmin._manager.run(call)


def describe_broker(kadmin, names: list[str] | None = None) -> dict[str, tuple[str | None, int]]:
    (r,) = kp_send(kadmin, DescribeConfigsRequest(resources=[(4, "0", names)], include_synonyms=False)).results
    assert r.error_code == 0, r
    return {c.name: (c.value, c.config_source) for c in r.configs}


def set_broker(kadmin, resource: str, name: str, value: str) -> tuple[int, str | None]:
    (r,) = kp_send(kadmin, IncrementalAlterConfigsRequest(resources=[(4, resource, [(name, 0, value)])],
                                                          validate_only=False)).responses
    return r.error_code, r.error_message


def set_topics(admin: AdminClient, changes: dict[str, tuple[str, str]]) -> dict[str, KafkaError | None]:
    """topic -> (key, value), one request; topic -> None or the error."""
    resources = [ConfigResource(ResourceType.TOPIC, t, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)]) for t, (k, v) in changes.items()]
    out = {}
    for resource, future in admin.incremental_alter_configs(resources).items():
        try:
            future.result(timeout=20)
            out[resource.name] = None
        except KafkaException as e:
            out[resource.name] = e.args[0]
    return out


def describe_topics(admin: AdminClient, topics: list[str]) -> dict[str, dict]:
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in topics])
    return {r.name: f.result(timeout=20) for r, f in futures.items()}


def topic_of(key: str) -> str:
    return "cp-" + key.replace(".", "-")


def chunks(items: list[str], n: int) -> list[list[str]]:
    size = -(-len(items) // n)
    return [items[i:i + size] for i in range(0, len(items), size)]


TOPIC_CASES = chunks(sorted(TOPIC_CONFIGS), 2)
DYNAMIC = sorted(name for name, key in BROKER_CONFIGS.items() if key.dynamic)
BROKER_CASES = chunks(DYNAMIC, 4)


@pytest.fixture(scope="module")
def topics(broker):
    admin = AdminClient(confluent_config(broker.bootstrap))
    futures = admin.create_topics([NewTopic(topic_of(k), 1, 1) for k in TOPIC_CONFIGS])
    for f in futures.values():
        f.result(timeout=30)
    return broker


# ------------------------------------------------------------------------------------------ the cases
@pytest.mark.parametrize("keys", TOPIC_CASES, ids=[f"topic-keys-{i}" for i in range(len(TOPIC_CASES))])
def test_every_topic_key(topics, keys):
    broker = topics
    admin = AdminClient(confluent_config(broker.bootstrap))
    names = [topic_of(k) for k in keys]
    before = describe_topics(admin, names)
    expected = {k: before[topic_of(k)][k].value for k in keys}     # the value in effect, as described
    lists = {k: values_for(TOPIC_CONFIGS[k]) for k in keys}
    rounds = max(len(v) for v in lists.values())
    answers = 0
    for i in range(rounds):
        changes = {topic_of(k): (k, lists[k][i]) for k in keys if i < len(lists[k])}
        results = set_topics(admin, changes)
        described = describe_topics(admin, list(changes))
        for topic, (k, raw) in changes.items():
            error, key = results[topic], TOPIC_CONFIGS[k]
            oracle = expected_answer(key, raw, broker=False)
            if error is None:
                assert oracle is not False, f"{k}={raw!r} was accepted outside its range"
                assert same(key, described[topic][k].value, raw), (k, raw, described[topic][k].value)
                expected[k] = described[topic][k].value
            else:
                assert error.code() == INVALID_CONFIG, (k, raw, error)
                assert oracle is not True, f"{k}={raw!r} was refused: {error.str()}"
                assert described[topic][k].value == expected[k], f"refused {k}={raw!r} changed it"
            answers += 1
    assert answers == sum(len(v) for v in lists.values())
    broker.restart()
    admin = AdminClient(confluent_config(broker.bootstrap))
    after = describe_topics(admin, names)
    assert {k: after[topic_of(k)][k].value for k in keys} == expected


@pytest.mark.parametrize("keys", BROKER_CASES, ids=[f"broker-keys-{i}" for i in range(len(BROKER_CASES))])
def test_every_dynamic_broker_key(broker, keys):
    kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    harmless = _harmless(broker.port)
    try:
        expected = {}
        current = describe_broker(kadmin)
        for name in keys:
            key = BROKER_CONFIGS[name]
            resource = "0" if name in PER_BROKER_CONFIGS else ""
            values = values_for(key) + ([harmless[name]] if name in harmless else [])
            for raw in values:
                code, message = set_broker(kadmin, resource, name, raw)
                (now,) = describe_broker(kadmin, [name]).values()
                oracle = expected_answer(key, raw, broker=True)
                if code == 0:
                    assert oracle is not False, f"{name}={raw!r} was accepted outside its range"
                    assert same(key, now[0], raw), (name, raw, now)
                    assert now[1] in (2, 3), (name, now)      # DYNAMIC_BROKER_CONFIG or its default layer
                    expected[name] = current[name] = now
                else:
                    assert code == INVALID_REQUEST, (name, raw, code, message)
                    assert oracle is not True, f"{name}={raw!r} was refused: {message}"
                    assert message, (name, raw)
                    assert now == current[name], f"refused {name}={raw!r} changed it"
            # nothing but the key itself changed (a refused value changes nothing anywhere)
            assert describe_broker(kadmin) == current, f"the values of {name} changed other configs"
    finally:
        kadmin.close()
    started = time.monotonic()
    broker.restart()
    assert time.monotonic() - started < 30
    kadmin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15000)
    try:
        after = describe_broker(kadmin)
        assert {n: after[n] for n in expected} == expected
    finally:
        kadmin.close()


# ------------------------------------------------------------------------------------------ the issue's values
def test_the_issues_values_apply_and_the_broker_restarts(broker_factory):
    """Issue 26: these were stored, failed the storage layer's check, closed the connection and kept
    the broker from starting again. Now: accepted with Kafka's meaning or refused before anything is
    stored, and records written before and after a restart are read back."""
    b = broker_factory()
    admin = AdminClient(confluent_config(b.bootstrap))
    kadmin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=15000)
    try:
        admin.create_topics([NewTopic("issue26", 1, 1)])["issue26"].result(timeout=20)
        produce_confluent(b.bootstrap, "issue26", [Msg(None, b"before-%d" % i) for i in range(5)])
        assert set_topics(admin, {"issue26": ("retention.bytes", "-5")}) == {"issue26": None}
        assert set_topics(admin, {"issue26": ("segment.index.bytes", "11")}) == {"issue26": None}
        assert set_broker(kadmin, "", "log.retention.bytes", "-5") == (0, None)
        assert set_broker(kadmin, "", "log.index.size.max.bytes", "4") == (0, None)
        assert set_broker(kadmin, "", "log.retention.ms", "-2") == (0, None)
        code, message = set_broker(kadmin, "", "num.replica.fetchers", "0")
        assert code == INVALID_REQUEST and "num.replica.fetchers" in message
        code, message = set_broker(kadmin, "", "log.roll.ms", "0")
        assert code == INVALID_REQUEST and "log.roll.ms" in message
        code = set_topics(admin, {"issue26": ("segment.index.bytes", "3")})["issue26"]
        assert code.code() == INVALID_CONFIG and "segment.index.bytes" in code.str()
        produce_confluent(b.bootstrap, "issue26", [Msg(None, b"middle-%d" % i) for i in range(5)])
        # CreateTopics and the legacy AlterConfigs go through the same checks; validate_only too
        created = admin.create_topics([NewTopic("issue26-ok", 1, 1, config={"retention.bytes": "-5"}),
                                       NewTopic("issue26-bad", 1, 1, config={"segment.index.bytes": "3"})])
        created["issue26-ok"].result(timeout=20)
        with pytest.raises(KafkaException) as refused:
            created["issue26-bad"].result(timeout=20)
        assert refused.value.args[0].code() == INVALID_CONFIG
        legacy = admin.alter_configs([ConfigResource(ResourceType.TOPIC, "issue26-ok",
                                                     set_config={"retention.bytes": "-7"})])
        next(iter(legacy.values())).result(timeout=20)
        entry = ConfigEntry("segment.index.bytes", "2", incremental_operation=AlterConfigOpType.SET)
        checked = admin.incremental_alter_configs(
            [ConfigResource(ResourceType.TOPIC, "issue26-ok", incremental_configs=[entry])], validate_only=True)
        with pytest.raises(KafkaException) as refused:
            next(iter(checked.values())).result(timeout=20)
        assert refused.value.args[0].code() == INVALID_CONFIG
        (r,) = kp_send(kadmin, IncrementalAlterConfigsRequest(
            resources=[(4, "", [("log.flush.interval.ms", 0, "-1")])], validate_only=True)).responses
        assert r.error_code == INVALID_REQUEST and "log.flush.interval.ms" in r.error_message
    finally:
        kadmin.close()
    b.restart()
    admin = AdminClient(confluent_config(b.bootstrap))
    config = describe_topics(admin, ["issue26"])["issue26"]
    assert (config["retention.bytes"].value, config["segment.index.bytes"].value) == ("-5", "11")
    assert config["retention.ms"].value == "-1"         # log.retention.ms -2: no time limit, as in Kafka
    ok = describe_topics(admin, ["issue26-ok"])["issue26-ok"]
    assert (ok["retention.bytes"].value, ok["segment.index.bytes"].value) == ("-7", "4")
    produce_confluent(b.bootstrap, "issue26", [Msg(None, b"after-%d" % i) for i in range(5)])
    consumer = confluent_consumer(b.bootstrap, group_id="issue26", auto_offset_reset="earliest")
    try:
        consumer.subscribe(["issue26"])
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 15 and time.monotonic() < deadline:
            m = consumer.poll(1.0)
            if m is not None and m.error() is None:
                seen.append(m.value())
    finally:
        consumer.close()
    assert seen == [b"%s-%d" % (w, i) for w in (b"before", b"middle", b"after") for i in range(5)]


def test_a_store_holding_values_that_cannot_apply_still_starts(broker_factory):
    """A store written before these checks (or by another writer) may hold values no log can take:
    the broker starts, logs one WARNING per value naming the key, value, entity and reason, uses the
    default for each, and applies the rest of the stored configs."""
    from odradek.cluster.store import Create, EmbeddedStore, SetData
    from odradek.cluster.topics import config_node, config_path

    b = broker_factory()
    admin = AdminClient(confluent_config(b.bootstrap))
    admin.create_topics([NewTopic("stored", 1, 1)])["stored"].result(timeout=20)
    assert b.stop() == 0
    store = EmbeddedStore.open(str(b.log_dir))
    try:
        topic = config_path("stored")
        layer = "/config/brokers/<default>"
        store.multi([
            (SetData if store.exists(topic) else Create)(topic, config_node(
                {"segment.index.bytes": "2", "retention.ms": "-7", "max.message.bytes": "2500"})),
            (SetData if store.exists(layer) else Create)(layer, {"version": 1, "config": {
                "log.roll.ms": "-5", "num.replica.fetchers": "0", "message.max.bytes": "3000"}}),
        ])
    finally:
        store.close()
    mark = b.log_size()
    b.start()
    lines = [line for line in b.log_text(mark).splitlines() if "ignoring the stored config" in line]
    for key, value, entity in (("segment.index.bytes", "'2'", "topic stored"), ("retention.ms", "'-7'", "topic stored"),
                               ("log.roll.ms", "'-5'", "the cluster default broker"),
                               ("num.replica.fetchers", "'0'", "the cluster default broker")):
        (line,) = [line for line in lines if f" {key}=" in line and entity in line]
        assert "WARNING" in line and value in line and "at least" in line, line
    admin = AdminClient(confluent_config(b.bootstrap))
    config = describe_topics(admin, ["stored"])["stored"]
    assert (config["segment.index.bytes"].value, config["retention.ms"].value) == ("10485760", "604800000")
    assert config["max.message.bytes"].value == "2500"
    kadmin = KafkaAdminClient(bootstrap_servers=b.bootstrap, request_timeout_ms=15000)
    try:
        described = describe_broker(kadmin, ["message.max.bytes", "num.replica.fetchers", "log.roll.ms"])
        assert described["message.max.bytes"] == ("3000", 3) and described["num.replica.fetchers"][0] == "1"
        assert described["log.roll.ms"][0] is None
    finally:
        kadmin.close()
    acks = produce_confluent(b.bootstrap, "stored", [Msg(None, b"x" * 100), Msg(None, b"y" * 3000)],
                             raise_errors=False, flush_each=True)
    assert [a.error.code() if a.error else None for a in acks] == [None, KafkaError.MSG_SIZE_TOO_LARGE]
