"""Windowed aggregation from a topic: page views per page per minute, on event time.

    python examples/windowed_counts.py                         # demo: own broker, sample page views
    python examples/windowed_counts.py --bootstrap localhost:9092 --topic page-views --continuous

Each record's Kafka timestamp is its event time; a 2-minute watermark bounds how late a view may
arrive and still count, and lets Spark drop old windows from its state.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time

import _demo


def build_query(spark, bootstrap: str, topic: str, checkpoint: str, continuous: bool):
    from pyspark.sql import functions as F
    views = (spark.readStream.format("odradek")
             .option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic)
             .option("startingOffsets", "earliest")
             .load()
             .select(F.col("value").cast("string").alias("page"), "timestamp"))
    counts = (views.withWatermark("timestamp", "2 minutes")
              .groupBy(F.window("timestamp", "1 minute"), "page")
              .count()
              .select(F.col("window.start").alias("minute"), "page", "count"))
    if not continuous:           # complete mode: the whole table each time, so it can be sorted
        counts = counts.orderBy("minute", "page")
    writer = (counts.writeStream.outputMode("complete" if not continuous else "update")
              .format("console").option("truncate", "false").option("numRows", "50")
              .option("checkpointLocation", checkpoint))
    return (writer.trigger(processingTime="5 seconds") if continuous else writer.trigger(availableNow=True)).start()


def produce_views(bootstrap: str, topic: str, n: int) -> None:
    from odradek.client import Producer
    pages = ["/", "/docs", "/pricing", "/blog", "/signup"]
    rng = random.Random(7)
    start_ms = (int(time.time()) // 60 - 10) * 60_000      # ten minutes of views, a minute apart

    async def send():
        async with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5}) as p:
            for i in range(n):
                ts = start_ms + i * 600_000 // n + rng.randrange(-5000, 5000)
                await p.send(topic, rng.choice(pages).encode(), timestamp_ms=ts)
            await p.flush()
    asyncio.run(send())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap")
    ap.add_argument("--topic", default="page-views")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--continuous", action="store_true")
    args = ap.parse_args()
    with _demo.broker(args.bootstrap) as bootstrap:
        if not args.bootstrap:
            _demo.create_topics(bootstrap, {args.topic: 2})
            produce_views(bootstrap, args.topic, 5000)
        spark = _demo.spark_session("windowed-counts")
        query = build_query(spark, bootstrap, args.topic, args.checkpoint or tempfile.mkdtemp(prefix="win-"),
                            args.continuous)
        query.awaitTermination()
        spark.stop()


if __name__ == "__main__":
    main()
