"""Streaming ETL: a topic of JSON orders -> a topic of enriched orders, with Structured Streaming.

    python examples/streaming_etl.py                          # demo: own broker, sample orders, runs to the end
    python examples/streaming_etl.py --bootstrap localhost:9092 --input orders --output orders-enriched \\
        --checkpoint /var/lib/etl/ckpt --continuous           # a long-running job

Reads with the `odradek` source (Spark's Kafka source options), writes with the `odradek` sink.
Delivery is at-least-once into the output topic: after a crash the query restarts from its
checkpoint and may write the last micro-batch again (Kafka's sink does the same).
"""

from __future__ import annotations

import argparse
import json
import tempfile

import _demo


def build_query(spark, bootstrap: str, src: str, dst: str, checkpoint: str, continuous: bool):
    from pyspark.sql import functions as F
    schema = "id LONG, customer STRING, amount DOUBLE"
    orders = (spark.readStream.format("odradek")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", src)
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "5000")
              .load()
              .select(F.from_json(F.col("value").cast("string"), schema).alias("o"), "timestamp")
              .select("o.*", "timestamp"))
    enriched = (orders.where("amount >= 10")
                .withColumn("amount_with_tax", F.round(F.col("amount") * 1.2, 2))
                .withColumn("size", F.when(F.col("amount") >= 100, "large").otherwise("small")))
    out = enriched.select(F.col("customer").alias("key"),
                          F.to_json(F.struct("id", "customer", "amount", "amount_with_tax", "size",
                                             "timestamp")).alias("value"))
    writer = (out.writeStream.format("odradek")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("topic", dst)
              .option("checkpointLocation", checkpoint))
    return (writer.trigger(processingTime="1 second") if continuous else writer.trigger(availableNow=True)).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap")
    ap.add_argument("--input", default="orders")
    ap.add_argument("--output", default="orders-enriched")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--continuous", action="store_true", help="keep running (default: stop when caught up)")
    args = ap.parse_args()
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="etl-ckpt-")
    with _demo.broker(args.bootstrap) as bootstrap:
        if not args.bootstrap:
            _demo.create_topics(bootstrap, {args.input: 3, args.output: 3})
            _demo.produce(bootstrap, args.input, (
                (b"c%d" % (i % 20), json.dumps({"id": i, "customer": f"c{i % 20}",
                                                 "amount": round((i * 37) % 250 + 0.5, 2)}).encode())
                for i in range(10_000)))
        spark = _demo.spark_session("streaming-etl")
        query = build_query(spark, bootstrap, args.input, args.output, checkpoint, args.continuous)
        query.awaitTermination()
        if not args.bootstrap:
            out = (spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
                   .option("subscribe", args.output).load())
            print("enriched orders written:", out.count())
            out.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").show(5, truncate=False)
        spark.stop()


if __name__ == "__main__":
    main()
