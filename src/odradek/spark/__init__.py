"""PySpark data source `odradek`: topics as DataFrames, batch and Structured Streaming, read and write.

Options and columns follow Spark's built-in Kafka source and sink, so a job written for
`format("kafka")` runs with `format("odradek")` against any Kafka-compatible broker, without the JVM
Kafka client. Depends on `odradek.client` only (DESIGN, "Layers").

- `source`: the DataSource, the batch reader, the schema
- `stream`: the streaming reader (offsets, read limits, Trigger.AvailableNow, data loss)
- `writer`: the Arrow writers (batch and streaming)
- `options`: option parsing; `planning`: offset ranges (pure); `decode` / `encode`: v2 batches <->
  Arrow (pure); `kafka`: the only module that talks to brokers

Spark registers the source by itself (`pyspark_odradek.DefaultSource`); `register(spark)` does it
explicitly.
"""

from __future__ import annotations

__all__ = ["OdradekDataSource", "register"]


def __getattr__(name: str):
    if name == "OdradekDataSource":
        from odradek.spark.source import OdradekDataSource
        return OdradekDataSource
    raise AttributeError(name)


def register(spark) -> None:
    """Register the `odradek` format with a SparkSession (not needed once the package is installed)."""
    from odradek.spark.source import OdradekDataSource
    spark.dataSource.register(OdradekDataSource)
