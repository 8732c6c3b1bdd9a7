"""Batch reads and writes through the `odradek` data source, against odradek and against Tansu.

Records are produced with confluent-kafka (librdkafka) and read back through Spark: exactly those
records, with their offsets, timestamps and headers; writes are read back with confluent-kafka.
"""

import math
import os
import signal

import pytest

from tests.spark.conftest import ROOT, consume_all, create_topic, is_tansu, produce, spark_subprocess, unique

PARTITIONS = 3
PER_PARTITION = 700
BASE_TS = 1_700_000_000_000


@pytest.fixture(scope="session")
def dataset(any_broker):
    """(bootstrap, topic, acknowledged records) of a 3-partition topic."""
    topic = unique("batch")
    create_topic(any_broker.bootstrap, topic, PARTITIONS)
    records = []
    for i in range(PARTITIONS * PER_PARTITION):
        p = i % PARTITIONS
        key = None if i % 10 == 0 else b"key-%d" % i
        value = b"value-%d-" % i + b"x" * (i % 150)
        headers = [("h", b"%d" % i), ("empty", None)] if i % 7 == 0 else []
        records.append((p, key, value, headers, BASE_TS + i))
    acked = produce(any_broker.bootstrap, topic, records, one_per_batch=is_tansu(any_broker))
    assert len(acked) == len(records)
    return any_broker.bootstrap, topic, acked


def reader(spark, bootstrap, **options):
    r = spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def as_tuples(rows, headers=True):
    out = []
    for r in rows:
        t = (r.partition, r.offset, r.key, r.value, int(r.timestamp.timestamp() * 1000 + 0.5))
        if headers:
            t += ([(h.key, h.value) for h in r.headers] if r.headers else [],)
        out.append(t)
    return sorted(out)


def expected(acked, headers=True):
    return sorted((p, o, k, v, ts) + ((list(h),) if headers else ()) for p, o, k, v, h, ts in acked)


def test_batch_read_returns_exactly_the_records(spark, dataset):
    bootstrap, topic, acked = dataset
    df = reader(spark, bootstrap, subscribe=topic, includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
                          "headers"]
    rows = df.collect()
    assert len(rows) == len(acked)
    assert {r.topic for r in rows} == {topic} and {r.timestampType for r in rows} == {0}
    assert as_tuples(rows) == expected(acked)
    for p in range(PARTITIONS):   # offsets of a partition: 0 .. n-1, each once
        assert sorted(r.offset for r in rows if r.partition == p) == list(range(PER_PARTITION))
    assert df.rdd.getNumPartitions() == PARTITIONS     # one task per topic-partition


def test_offset_ranges(spark, dataset):
    bootstrap, topic, acked = dataset
    start = {topic: {"0": 10, "1": -2, "2": 600}}
    end = {topic: {"0": 20, "1": -1, "2": 601}}
    import json
    rows = reader(spark, bootstrap, subscribe=topic, startingOffsets=json.dumps(start),
                  endingOffsets=json.dumps(end)).collect()
    want = [(p, o) for p, o, *_ in acked if (p == 0 and 10 <= o < 20) or p == 1 or (p == 2 and o == 600)]
    assert sorted((r.partition, r.offset) for r in rows) == sorted(want)


def test_min_partitions_and_max_records_split_without_changing_rows(spark, dataset):
    bootstrap, topic, acked = dataset
    df = reader(spark, bootstrap, subscribe=topic, minPartitions="8")
    assert df.rdd.getNumPartitions() >= 8
    assert as_tuples(df.collect(), headers=False) == expected(acked, headers=False)
    df = reader(spark, bootstrap, subscribe=topic, maxRecordsPerPartition="100")
    assert df.rdd.getNumPartitions() == PARTITIONS * math.ceil(PER_PARTITION / 100)
    assert df.count() == len(acked)


def test_timestamps(spark, dataset, any_broker):
    bootstrap, topic, acked = dataset
    cut = BASE_TS + 900
    rows = reader(spark, bootstrap, subscribe=topic, startingTimestamp=str(cut)).collect()
    got = sorted((r.partition, r.offset) for r in rows)
    if is_tansu(any_broker):
        # Tansu's finding T2 (tests/integration/test_client_peer.py): its memory engine answers
        # ListOffsets by timestamp with the earliest offset, so the read starts at the beginning.
        assert got == sorted((p, o) for p, o, *_ in acked)
        return
    assert got == sorted((p, o) for p, o, *_, ts in acked if ts >= cut)
    end = {topic: {str(p): cut for p in range(PARTITIONS)}}
    import json
    rows = reader(spark, bootstrap, subscribe=topic, endingOffsetsByTimestamp=json.dumps(end)).collect()
    assert sorted((r.partition, r.offset) for r in rows) == sorted((p, o) for p, o, *_, ts in acked if ts < cut)


def test_assign_and_pattern(spark, dataset):
    bootstrap, topic, acked = dataset
    rows = reader(spark, bootstrap, assign=f'{{"{topic}":[2]}}').collect()
    assert sorted(r.offset for r in rows) == list(range(PER_PARTITION)) and {r.partition for r in rows} == {2}
    pattern = topic.split("-")[0] + "-" + topic.split("-")[1][:4] + ".*"
    assert reader(spark, bootstrap, subscribePattern=pattern).count() == len(acked)


def test_batch_write_then_read_back(spark, any_broker):
    bootstrap = any_broker.bootstrap
    out = unique("written")
    create_topic(bootstrap, out, 4)
    n = 5000
    df = spark.range(n).selectExpr(
        "CASE WHEN id % 5 = 0 THEN NULL ELSE CAST(concat('k', id) AS BINARY) END AS key",
        "CAST(concat('v', id, repeat('y', CAST(id % 90 AS INT))) AS BINARY) AS value",
        "CASE WHEN id % 3 = 0 THEN array(named_struct('key', 'id', 'value', CAST(CAST(id AS STRING) AS BINARY)))"
        " ELSE NULL END AS headers",
        "CASE WHEN id % 11 = 0 THEN CAST(id % 4 AS INT) ELSE NULL END AS partition")
    df.write.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("topic", out) \
        .mode("append").save()
    got = consume_all(bootstrap, out, n)
    assert len(got) == n
    rows = {r.value: r for r in df.collect()}
    from odradek.client import partition_for_key
    for p, _o, k, v, h in got:
        r = rows.pop(v)
        assert k == r.key
        assert [(x, bytes(y)) for x, y in h] == ([("id", r.headers[0].value)] if r.headers else [])
        if r.partition is not None:
            assert p == r.partition
        elif k is not None:
            assert p == partition_for_key(k, 4)     # Kafka's murmur2, as the Java client places keys
    assert not rows
    # string columns and a topic column
    spark.createDataFrame([(out, "late", "row")], "topic string, key string, value string") \
        .write.format("odradek").option("kafka.bootstrap.servers", bootstrap).mode("append").save()
    assert (len(consume_all(bootstrap, out, n + 1)) == n + 1)
    if not is_tansu(any_broker):   # Tansu's ListOffsets(latest) is off for multi-record batches
        assert reader(spark, bootstrap, subscribe=out).count() == n + 1


def test_write_through_the_per_record_path(spark, odradek_broker):
    """Compression asked for: rows go through the client's per-record send (which compresses)."""
    bootstrap = odradek_broker.bootstrap
    out = unique("compressed")
    create_topic(bootstrap, out, 2)
    df = spark.range(300).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    df.write.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("topic", out) \
        .option("kafka.compression.type", "gzip").mode("append").save()
    rows = reader(spark, bootstrap, subscribe=out).collect()
    assert sorted(int(r.value) for r in rows) == list(range(300))
    assert all(r.key == r.value for r in rows)


def test_idempotent_write_sends_whole_batches_stamped(spark, odradek_broker):
    """kafka.enable.idempotence=true: rows still go as whole Arrow-encoded batches (send_batch), each
    stamped with the task producer's id and sequence."""
    import asyncio

    from odradek.client import Consumer, TopicPartition
    from odradek.records.header import BatchHeader

    bootstrap = odradek_broker.bootstrap
    out = unique("idempotent")
    create_topic(bootstrap, out, 1)
    df = spark.range(2000).coalesce(1).selectExpr("CAST(id AS STRING) AS value")
    df.write.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("topic", out) \
        .option("kafka.enable.idempotence", "true").mode("append").save()

    async def headers():
        async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
            c.assign([TopicPartition(out, 0)])
            got = []
            while sum(h.records_count for h in got) < 2000:
                batches = await c.fetch_batches(timeout_ms=5000)
                assert batches, "records missing"
                got += [BatchHeader(bytes(b.data)) for b in batches]
            return got
    hs = asyncio.run(headers())
    assert len({h.producer_id for h in hs}) == 1 and hs[0].producer_id >= 0
    assert [h.base_sequence for h in hs] == [h.base_offset for h in hs]   # one task: sequences follow offsets
    assert sorted(int(r.value) for r in reader(spark, bootstrap, subscribe=out).collect()) == list(range(2000))


def test_bad_options_fail_clearly(spark, dataset):
    bootstrap, topic, _ = dataset
    with pytest.raises(Exception, match="Exactly one"):
        reader(spark, bootstrap).collect()
    with pytest.raises(Exception, match="must name every subscribed"):
        reader(spark, bootstrap, subscribe=topic, startingOffsets=f'{{"{topic}":{{"0":1}}}}').collect()


def test_transaction_markers_are_not_data_loss(spark, tansu_broker):
    """Offsets taken by transaction markers (and aborted records) leave gaps; reading across them,
    with failOnDataLoss=true, is not data loss. On the peer: odradek's broker has no transactions yet."""
    from confluent_kafka import Producer
    bs = tansu_broker.bootstrap
    topic = unique("txn")
    create_topic(bs, topic, 1)
    p = Producer({"bootstrap.servers": bs, "transactional.id": unique("tid")})
    p.init_transactions(30)
    for values, commit in ((range(0, 5), True), (range(100, 105), False), (range(5, 8), True)):
        p.begin_transaction()
        for i in values:
            p.produce(topic, b"v%d" % i, partition=0)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    for isolation in ("read_committed", "read_uncommitted"):
        rows = reader(spark, bs, subscribe=topic, failOnDataLoss="true",
                      **{"kafka.isolation.level": isolation}).orderBy("offset").collect()
        values = [r.value for r in rows]
        if isolation == "read_committed":
            assert values == [b"v%d" % i for i in range(8)]
        assert set(values) >= {b"v%d" % i for i in range(8)}
        offsets = [r.offset for r in rows]
        assert offsets == sorted(set(offsets)) and offsets[-1] > len(offsets) - 1     # gaps: the markers


def test_found_without_registration(odradek_broker, tmp_path):
    """A driver of its own that never imports odradek nor calls register() reads format("odradek"):
    PySpark discovered pyspark_odradek.DefaultSource (in this session register() may have run)."""
    topic = unique("discovered")
    create_topic(odradek_broker.bootstrap, topic, 2)
    produce(odradek_broker.bootstrap, topic, [(i % 2, None, b"v%d" % i, [], None) for i in range(37)])
    log = tmp_path / "job.log"
    proc = spark_subprocess(str(ROOT / "tests/spark/jobs/count_without_register.py"), odradek_broker.bootstrap,
                            topic, log=log)
    try:
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-4000:]
    assert text.strip().splitlines()[-1] == "COUNT 37", text[-4000:]


def test_registered_explicitly(spark, dataset):
    """register() adds the same source by hand (for a session started without the package on its path)."""
    import pyspark_odradek
    from odradek.spark import OdradekDataSource, register
    assert pyspark_odradek.DefaultSource is OdradekDataSource and OdradekDataSource.name() == "odradek"
    register(spark)
    bootstrap, topic, acked = dataset
    assert reader(spark, bootstrap, subscribe=topic).count() == len(acked)
