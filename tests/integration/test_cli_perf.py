"""`odradek perf produce` and `odradek perf consume` as subprocesses against a real broker: the records
arrive (counted by confluent-kafka), the summaries carry the numbers Kafka's perf tests print."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .cli_support import new_name, odradek, unreachable
from .clients import confluent_config, confluent_consumer


@pytest.fixture(scope="module")
def topic(broker):
    t = new_name("cli-perf")
    admin = AdminClient(confluent_config(broker.bootstrap))
    admin.create_topics([NewTopic(t, 2, 1)])[t].result(timeout=20)
    return t


def high_watermarks(bootstrap: str, topic: str) -> int:
    c = confluent_consumer(bootstrap)
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1))
    finally:
        c.close()


def test_perf_produce_then_consume(broker, topic):
    s = odradek("perf", "produce", "--topic", topic, "--num-records", "20000", "--record-size", "100",
                "--throughput", "-1", "--compression", "lz4", "--json", bootstrap=broker.bootstrap).ok().json()
    assert s["records"] == 20000 and s["records_per_s"] > 0 and s["mb_per_s"] > 0
    assert 0 <= s["latency_p50_ms"] <= s["latency_p95_ms"] <= s["latency_p99_ms"] <= s["latency_p99.9_ms"] \
        <= s["latency_max_ms"]
    assert high_watermarks(broker.bootstrap, topic) == 20000
    c = odradek("perf", "consume", "--topic", topic, "--messages", "20000", "--json",
                bootstrap=broker.bootstrap).ok().json()
    assert c["records"] == 20000 and c["mb"] == round(20000 * 100 / 1024 / 1024, 4) and c["records_per_s"] > 0


def test_perf_produce_throughput_cap_and_table(broker, topic):
    r = odradek("perf", "produce", "--topic", topic, "--num-records", "300", "--record-size", "10",
                "--throughput", "200", bootstrap=broker.bootstrap).ok()
    rows = dict(line.strip().rsplit(None, 1) for line in r.stdout.splitlines()[1:]
                if len(line.split()) >= 2 and line.split()[-1].replace(".", "").isdigit())
    assert rows["records"] == "300" and "latency p99.9 ms" in rows
    assert float(rows["records/s"]) <= 200 * 1.1


def test_perf_consume_stops_when_records_run_out(broker, topic):
    r = odradek("perf", "consume", "--topic", topic, "--messages", "10000000", "--timeout-ms", "1000",
                bootstrap=broker.bootstrap).ok()
    assert "only" in r.stderr and "records/s" in r.stdout


def test_perf_errors(broker):
    missing = new_name("cli-nosuch")
    odradek("perf", "consume", "--topic", missing, "--messages", "1",
            bootstrap=broker.bootstrap).fails("UNKNOWN_TOPIC_OR_PARTITION")
    odradek("perf", "produce", "--topic", "t", "--num-records", "1", "--record-size", "1", "--throughput", "0",
            bootstrap=broker.bootstrap).fails("--throughput", status=2)
    addr = unreachable()
    odradek("perf", "produce", "--topic", "t", "--num-records", "1", "--record-size", "1", "--timeout", "1",
            bootstrap=addr).fails(f"cannot reach the cluster at {addr}")
