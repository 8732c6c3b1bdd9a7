"""A streaming query run as its own process (its own Spark driver) so a test can kill it with SIGKILL
in the middle of a micro-batch: topic -> Parquet file sink, each batch slowed down on purpose.

    python slow_stream_to_files.py BOOTSTRAP TOPIC OUT CHECKPOINT
"""

import sys
import time

from tests.spark.conftest import spark_session


def slow(value):
    time.sleep(0.005)          # 300 rows: a batch takes a while, so the kill lands inside one
    return value


def main() -> None:
    bootstrap, topic, out, ckpt = sys.argv[1:5]
    spark = spark_session("slow-stream")
    df = (spark.readStream.format("odradek").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "300")
          .load())
    from pyspark.sql import functions as F
    slowed = df.withColumn("value", F.udf(slow, "binary")("value"))
    q = (slowed.writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", ckpt).trigger(processingTime="100 milliseconds").start())
    q.awaitTermination()


if __name__ == "__main__":
    main()
