"""A fresh Spark driver that reads a topic through format("odradek") without importing odradek and
without calling register(): Spark must find the data source by itself, as PySpark finds every
top-level `pyspark_*` package's `DefaultSource` (pyspark_odradek).

    python count_without_register.py BOOTSTRAP TOPIC      prints "COUNT <rows>" last
"""

import sys

from tests.spark.conftest import spark_session


def main() -> None:
    bootstrap, topic = sys.argv[1:3]
    spark = spark_session("discovery")
    ours = [m for m in sys.modules if m.split(".")[0] in ("odradek", "pyspark_odradek")]
    assert not ours, f"the driver imported {ours} before reading"
    rows = (spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load().count())
    spark.stop()
    print(f"COUNT {rows}", flush=True)


if __name__ == "__main__":
    main()
