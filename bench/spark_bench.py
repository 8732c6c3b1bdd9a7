"""PySpark connector benchmark: write N records through the `odradek` sink (Arrow writer), then read
them back into count(), against odradek and the peer broker (Tansu) in the same run.

    python bench/spark_bench.py                       # 5,000,000 x 100 B, both brokers
    python bench/spark_bench.py --only odradek --records 1000000
    python bench/spark_bench.py --ceiling             # also: Spark's own cost for the same rows

Figures are rows per second of wall time for the Spark job (local[2], the broker on the same
machine). `--ceiling` runs a Python data source that yields the same Arrow batches from memory,
with no broker and no decoding: the most this machine's Spark can take through the Python Data
Source API, so the connector's own cost is visible.

Each partition gets exactly records/partitions rows (a `partition` column), so the read uses explicit
endingOffsets and does not rely on ListOffsets(latest) (Tansu's memory engine answers it with the
last batch's base offset + 1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import brokers  # noqa: E402

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_session():
    from pyspark.sql import SparkSession
    s = (SparkSession.builder.master("local[2]").appName("spark-bench").config("spark.ui.enabled", "false")
         .config("spark.driver.memory", "4g").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    return s


def _cpu_by_kind(spark, broker) -> dict[str, float]:
    """CPU seconds so far of: the broker, the Spark JVM, and its Python workers (the connector's code;
    they are the JVM's descendants)."""
    jvm = spark.sparkContext._gateway.proc.pid
    own = _own_cpu(jvm)
    return {"broker": broker.cpu_seconds(), "jvm": own, "python_workers": brokers._proc_tree_cpu(jvm) - own}


def _own_cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_delta(before: dict, after: dict, n: int) -> str:
    return ", ".join(f"{k} {(after[k] - before[k]) / n * 1e6:.2f}" for k in before) + " CPU-us/row"


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)
    time.sleep(1)


def bench_write(spark, bootstrap: str, topic: str, n: int, size: int, partitions: int) -> float:
    rows = (spark.range(n, numPartitions=partitions)     # generated on the fly: tens of ns a row
            .selectExpr(f"CAST(repeat('x', {size}) AS BINARY) AS value",
                        f"CAST(id % {partitions} AS INT) AS partition"))
    t = time.perf_counter()
    (rows.write.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .mode("append").save())
    return time.perf_counter() - t


def bench_read(spark, bootstrap: str, topic: str, n: int, partitions: int) -> tuple[float, int]:
    end = {topic: {str(p): n // partitions + (1 if p < n % partitions else 0) for p in range(partitions)}}
    df = (spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
          .option("endingOffsets", json.dumps(end)).load())
    t = time.perf_counter()
    count = df.count()
    return time.perf_counter() - t, count


def bench_ceiling(spark, n: int, size: int, partitions: int) -> float:
    """The same rows from memory through the Python Data Source API: Spark's own cost."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Reader(DataSourceReader):
        def partitions(self):
            return [InputPartition(p) for p in range(partitions)]

        def read(self, partition):
            import numpy as np
            import pyarrow as pa
            per = n // partitions
            m = 65536
            value = pa.array([b"x" * size] * m, pa.binary())
            batch = pa.RecordBatch.from_arrays([
                pa.nulls(m, pa.binary()), value, pa.array(["t"] * m), pa.array(np.zeros(m, np.int32)),
                pa.array(np.arange(m, dtype=np.int64)), pa.array(np.zeros(m, np.int64), pa.timestamp("us", tz="UTC")),
                pa.array(np.zeros(m, np.int32))],
                names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"])
            left = per
            while left > 0:
                yield batch.slice(0, min(m, left))
                left -= m

    class Source(DataSource):
        @classmethod
        def name(cls):
            return "bench_ceiling"

        def schema(self):
            return ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                    "timestampType int")

        def reader(self, schema):
            return Reader()

    spark.dataSource.register(Source)
    df = spark.read.format("bench_ceiling").load()
    df.count()
    t = time.perf_counter()
    df.count()
    return time.perf_counter() - t


def run(kind: str, spark, args) -> dict:
    b = brokers.Broker(kind, brokers.default_command("peer" if kind == "peer" else "odradek"))
    b.start()
    try:
        topic = f"spark-bench-{int(time.time())}"
        create_topic(b.bootstrap, topic, args.partitions)
        create_topic(b.bootstrap, topic + "-warmup", args.partitions)
        bench_write(spark, b.bootstrap, topic + "-warmup", max(args.records // 10, 1000), args.size,
                    args.partitions)                   # JIT and Python workers warm, as in a long job
        best_write = None
        for _ in range(args.repeat):     # each write appends; reads stop at the first `records`
            c0 = _cpu_by_kind(spark, b)
            wt = bench_write(spark, b.bootstrap, topic, args.records, args.size, args.partitions)
            c1 = _cpu_by_kind(spark, b)
            best_write = wt if best_write is None else min(best_write, wt)
            print(f"  [{kind}] write {args.records:,} x {args.size} B: {wt:.1f} s, {args.records / wt:,.0f} rows/s "
                  f"({_cpu_delta(c0, c1, args.records)})")
        best = None
        for _ in range(args.repeat):
            c0 = _cpu_by_kind(spark, b)
            rt, count = bench_read(spark, b.bootstrap, topic, args.records, args.partitions)
            c1 = _cpu_by_kind(spark, b)
            assert count == args.records, f"read {count} records, wrote {args.records}"
            best = rt if best is None else min(best, rt)
            print(f"  [{kind}] read into count(): {rt:.1f} s, {args.records / rt:,.0f} rows/s "
                  f"({_cpu_delta(c0, c1, args.records)})")
        return {"write_rows_per_s": args.records / best_write, "read_rows_per_s": args.records / best}
    finally:
        b.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="writes and reads per broker (the best is kept)")
    ap.add_argument("--only", choices=("odradek", "peer", "both"), default="both")
    ap.add_argument("--ceiling", action="store_true")
    args = ap.parse_args()
    brokers.install_cleanup()
    spark = spark_session()
    results = {}
    kinds = ["odradek", "peer"] if args.only == "both" else [args.only]
    for kind in kinds:
        results[kind] = run(kind, spark, args)
    if args.ceiling:
        dt = bench_ceiling(spark, args.records, args.size, args.partitions)
        results["ceiling"] = {"read_rows_per_s": args.records / dt}
        print(f"  [ceiling] same rows from memory into count(): {args.records / dt:,.0f} rows/s")
    print(json.dumps(results, indent=2))
    if "odradek" in results and "peer" in results:
        for k in ("write_rows_per_s", "read_rows_per_s"):
            print(f"odradek/peer {k}: {results['odradek'][k] / results['peer'][k]:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()
