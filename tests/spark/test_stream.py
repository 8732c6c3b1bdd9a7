"""Structured Streaming through the `odradek` source and sink, against a real odradek broker.

Restarts from a checkpoint, read limits, new partitions and topics, data loss, topic-to-topic ETL.
Queries mostly run with Trigger.AvailableNow, which ends by itself once it has read what was there.
"""

import json
import shutil
import threading
import time

import pytest

from tests.spark.conftest import consume_all, create_topic, produce, unique, wait_partitions_led

TIMEOUT_S = 180


def source(spark, bootstrap, **options):
    r = spark.readStream.format("odradek").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def run_to_parquet(spark, df, out, ckpt, available_now=True):
    w = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
    q = (w.trigger(availableNow=True) if available_now else w.trigger(processingTime="300 milliseconds")).start()
    if available_now:
        assert q.awaitTermination(TIMEOUT_S), "the AvailableNow query did not finish"
        if q.exception():
            raise q.exception()
    return q


def offsets_in(spark, out):
    return sorted((r.topic, r.partition, r.offset) for r in spark.read.parquet(str(out)).collect())


def records(n, partitions, start=0):
    return [(i % partitions, b"k%d" % i, b"v%d" % i, [], None) for i in range(start, start + n)]


def test_restart_from_checkpoint_no_duplicate_no_gap(spark, odradek_broker, tmp_path):
    bs = odradek_broker.bootstrap
    topic = unique("restart")
    create_topic(bs, topic, 2)
    produce(bs, topic, records(400, 2))
    df = source(spark, bs, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="150")
    q = run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt")
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 400 and max(sizes) <= 150 and len(sizes) >= 3      # maxOffsetsPerTrigger
    produce(bs, topic, records(300, 2, start=400))
    run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt")
    got = offsets_in(spark, tmp_path / "out")
    assert got == sorted((topic, p, o) for p in range(2) for o in range(350))


def test_stop_mid_stream_and_resume(spark, odradek_broker, tmp_path):
    """A continuously triggered query stopped while records keep coming, then restarted."""
    bs = odradek_broker.bootstrap
    topic = unique("resume")
    create_topic(bs, topic, 2)
    stop = threading.Event()

    def feed():
        i = 0
        while not stop.is_set() and i < 3000:
            produce(bs, topic, records(100, 2, start=i))
            i += 100
    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        df = source(spark, bs, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="120")
        q = run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt", available_now=False)
        deadline = time.monotonic() + TIMEOUT_S
        while len([p for p in q.recentProgress if p["numInputRows"]]) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        q.stop()
    finally:
        stop.set()
        feeder.join()
    run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt")
    got = offsets_in(spark, tmp_path / "out")
    total = len(got)
    per = {p: sorted(o for _, pp, o in got if pp == p) for p in range(2)}
    assert total == sum(len(v) for v in per.values())
    for p, offs in per.items():
        assert offs == list(range(len(offs))), f"partition {p}: a gap or a duplicate"
    assert total == len(consume_all(bs, topic, total))


def test_new_partitions_and_new_topics_are_read_from_earliest(spark, odradek_broker, tmp_path):
    from confluent_kafka.admin import AdminClient, NewPartitions
    bs = odradek_broker.bootstrap
    prefix = unique("pat")
    create_topic(bs, f"{prefix}-a", 1)
    produce(bs, f"{prefix}-a", records(50, 1))
    df = source(spark, bs, subscribePattern=f"{prefix}-.*", startingOffsets="earliest")
    run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt")
    create_topic(bs, f"{prefix}-b", 2)
    admin = AdminClient({"bootstrap.servers": bs})      # kept alive until its futures are done
    for f in admin.create_partitions([NewPartitions(f"{prefix}-a", 2)]).values():
        f.result(30)
    wait_partitions_led(admin, f"{prefix}-a", 2)
    produce(bs, f"{prefix}-a", records(40, 2, start=50))
    produce(bs, f"{prefix}-b", records(30, 2))
    run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt")
    got = offsets_in(spark, tmp_path / "out")
    want = [(f"{prefix}-a", 0, o) for o in range(70)] + [(f"{prefix}-a", 1, o) for o in range(20)] + \
        [(f"{prefix}-b", p, o) for p in range(2) for o in range(15)]
    assert got == sorted(want)


def test_fail_on_data_loss(spark, odradek_broker, tmp_path):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    bs = odradek_broker.bootstrap
    topic = unique("loss")
    create_topic(bs, topic, 1)
    produce(bs, topic, records(100, 1))
    df = source(spark, bs, subscribe=topic, startingOffsets="earliest")
    run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt")
    produce(bs, topic, records(100, 1, start=100))
    admin = AdminClient({"bootstrap.servers": bs})
    for f in admin.delete_records([TopicPartition(topic, 0, 150)]).values():
        f.result(30)                       # offsets 100..149 are gone before the query read them
    shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt2")
    shutil.copytree(tmp_path / "out", tmp_path / "out2")
    with pytest.raises(Exception, match="failOnDataLoss"):
        run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt")
    lenient = source(spark, bs, subscribe=topic, startingOffsets="earliest", failOnDataLoss="false")
    run_to_parquet(spark, lenient, tmp_path / "out2", tmp_path / "ckpt2")
    files = spark.read.parquet(str(tmp_path / "out2" / "*.parquet"))   # the copy's sink log names `out`
    assert sorted(r.offset for r in files.collect()) == list(range(100)) + list(range(150, 200))


def test_streaming_etl_topic_to_topic(spark, odradek_broker, tmp_path):
    bs = odradek_broker.bootstrap
    src, dst = unique("etl-in"), unique("etl-out")
    create_topic(bs, src, 2)
    create_topic(bs, dst, 3)
    produce(bs, src, records(1000, 2))
    df = source(spark, bs, subscribe=src, startingOffsets="earliest", maxOffsetsPerTrigger="400")
    q = (df.selectExpr("key", "upper(CAST(value AS STRING)) AS value")
         .writeStream.format("odradek").option("kafka.bootstrap.servers", bs).option("topic", dst)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(TIMEOUT_S)
    assert q.exception() is None
    got = consume_all(bs, dst, 1000)
    assert sorted(v for *_, v, _h in got) == sorted(b"V%d" % i for i in range(1000))
    from odradek.client import partition_for_key
    assert all(p == partition_for_key(k, 3) for p, _o, k, _v, _h in got)


def test_min_offsets_per_trigger_waits_for_enough_records(spark, odradek_broker):
    bs = odradek_broker.bootstrap
    topic = unique("minrows")
    create_topic(bs, topic, 1)
    name = topic.replace("-", "_")
    df = source(spark, bs, subscribe=topic, startingOffsets="earliest", minOffsetsPerTrigger="500",
                maxTriggerDelay="60s")
    # Triggers that run no batch report progress too (every 100 ms here, not every 10 s): the test
    # sees Spark look at the 100 records and hold them back.
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100ms")
    q = df.writeStream.format("memory").queryName(name).trigger(processingTime="200 milliseconds").start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not q.recentProgress and time.monotonic() < deadline:    # the first trigger always runs
            time.sleep(0.1)
        produce(bs, topic, records(100, 1))

        def held_back() -> int:
            """Triggers that saw the 100 records available and planned no batch for them."""
            latest = [p["sources"][0]["latestOffset"] for p in q.recentProgress if p["numInputRows"] == 0]
            return sum(1 for o in latest if (json.loads(o) if isinstance(o, str) else o) == {topic: {"0": 100}})
        while held_back() < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert held_back() >= 3
        assert spark.sql(f"SELECT count(*) AS n FROM {name}").first().n == 0
        produce(bs, topic, records(450, 1, start=100))
        while spark.sql(f"SELECT count(*) AS n FROM {name}").first().n < 550 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert spark.sql(f"SELECT count(*) AS n FROM {name}").first().n == 550
        assert max(p["numInputRows"] for p in q.recentProgress) == 550         # one batch
    finally:
        q.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


def test_commit_offsets_to_group_for_lag_tools(spark, odradek_broker, tmp_path):
    """commitOffsetsToGroup: the query's progress shows up as a consumer group's committed offsets."""
    from confluent_kafka import Consumer, TopicPartition
    bs = odradek_broker.bootstrap
    topic, group = unique("lag"), unique("lag-group")
    create_topic(bs, topic, 2)
    produce(bs, topic, records(300, 2))
    df = source(spark, bs, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="100",
                commitOffsetsToGroup=group)
    run_to_parquet(spark, df, tmp_path / "out", tmp_path / "ckpt")
    c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
    try:
        committed = c.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
    finally:
        c.close()
    assert {tp.partition: tp.offset for tp in committed} == {0: 150, 1: 150}
