"""The `odradek` Python data source: Spark's Kafka source and sink, on `odradek.client`.

    df = (spark.read.format("odradek")
          .option("kafka.bootstrap.servers", "localhost:9092")
          .option("subscribe", "events")
          .load())                                          # key, value, topic, partition, offset, ...

Spark finds it by itself once the package is installed (`pyspark_odradek.DefaultSource`), or after
`odradek.spark.register(spark)`. Options and columns are those of Spark's built-in Kafka source and
sink (`options`). Reading: the planner resolves offsets and cuts ranges (`planning`), one task per
range reads through its own client (`kafka.read_range`); streaming: `stream`; writing: `writer`.
"""

from __future__ import annotations

from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType,
)

from odradek.spark import planning
from odradek.spark.options import ReadOptions, parse_read_options, parse_write_options

NAME = "odradek"


def kafka_schema(include_headers: bool) -> StructType:
    """Spark's Kafka source schema (KafkaRecordToRowConverter)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


def arrow_schema(schema: StructType):
    """The Arrow schema Spark checks a Python data source's batches against."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema, timezone="UTC")


class RangePartition(InputPartition):
    """One Spark task: one offset range of one topic-partition."""

    def __init__(self, r: planning.OffsetRange) -> None:
        super().__init__(r)
        self.range = r


def read_partition(opts: ReadOptions, schema: StructType, partition: InputPartition) -> Iterator:
    from odradek.spark.kafka import read_range   # on the executor: the client is opened here, per task
    r = getattr(partition, "range", None)
    if r is None:
        return iter(())
    return read_range(opts.client, r, include_headers=opts.include_headers,
                      fail_on_data_loss=opts.fail_on_data_loss, poll_timeout_ms=opts.poll_timeout_ms,
                      schema=arrow_schema(schema))


def current_partitions(admin, opts: ReadOptions) -> list[planning.TP]:
    sub = opts.subscription
    if sub.kind == "assign":
        return sorted(sub.assigned)
    counts = admin.partition_counts(sub.topics if sub.kind == "subscribe" else None)
    return sub.partitions(counts)


def resolve_spec(admin, opts: ReadOptions, spec, tps, *, starting: bool,
                 earliest=None, latest=None) -> dict[planning.TP, int]:
    earliest = admin.earliest(tps) if earliest is None else earliest
    latest = admin.latest(tps) if latest is None else latest
    found = admin.offsets_for_times(planning.timestamps_to_look_up(spec, tps))
    return planning.resolve(spec, tps, earliest, latest, found, starting=starting,
                            strategy=opts.starting_timestamp_strategy)


class BatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        from odradek.spark.kafka import Admin
        opts = self.opts
        with Admin(opts.client) as admin:
            tps = current_partitions(admin, opts)
            earliest = admin.earliest(tps)
            latest = admin.latest(tps)
            start = resolve_spec(admin, opts, opts.starting, tps, starting=True, earliest=earliest, latest=latest)
            end = resolve_spec(admin, opts, opts.ending, tps, starting=False, earliest=earliest, latest=latest)
        ranges = planning.split_ranges(planning.batch_ranges(start, end), opts.min_partitions,
                                       opts.max_records_per_partition)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(self.opts, self.schema, partition)


class OdradekDataSource(DataSource):
    """Spark's Kafka source and sink, named `odradek`."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        raw = {str(k).lower(): v for k, v in dict(self.options).items()}.get("includeheaders", "false")
        return kafka_schema(str(raw).strip().lower() == "true")

    def reader(self, schema: StructType) -> BatchReader:
        return BatchReader(parse_read_options(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType):
        from odradek.spark.stream import StreamReader
        return StreamReader(parse_read_options(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool):
        from odradek.spark.writer import BatchWriter, check_mode
        check_mode(overwrite)
        return BatchWriter(parse_write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from odradek.spark.writer import StreamWriter
        return StreamWriter(parse_write_options(self.options), schema)
