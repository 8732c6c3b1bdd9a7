"""A streaming query through the exactly-once sink, run as its own process (its own Spark driver) so a
test can kill it with SIGKILL: topic -> "copied:"+value -> topic, each micro-batch slowed down on
purpose so a kill lands inside one.

    python eos_stream.py BOOTSTRAP INPUT OUTPUT CHECKPOINT MODE

MODE: `run` (processing-time triggers until killed), `available-now` (stops once the input is read), or
`crash-after-marker:<batch>`: the driver is killed from inside (its process group, as SIGKILL from outside
would be) while committing that micro-batch, after the marker is committed and the first task's transaction
with it, before the others (noted in the file CHECKPOINT.crashed): the restarted query must roll that
batch forward and write nothing twice.
The crash is injected by wrapping `exactly_once.commit_all` in the Python worker that runs the commit
(this module is imported there, as it defines the data source class Spark unpickles).
"""

import os
import signal
import sys
import time

from odradek.spark import exactly_once
from odradek.spark.source import OdradekDataSource

CRASH_ENV = "EOS_STREAM_CRASH_AT_BATCH"
NOTE_ENV = "EOS_STREAM_CRASH_NOTE"


class CrashingSink(OdradekDataSource):
    """The odradek data source; its stream writer crashes the driver mid-commit when asked to."""

    @classmethod
    def name(cls) -> str:
        return "odradek_crashing"

    def streamWriter(self, schema, overwrite):
        writer = super().streamWriter(schema, overwrite)
        crash_at = os.environ.get(CRASH_ENV)
        if crash_at is not None:
            commit = writer.commit

            def commit_then_crash(messages, batch_id):
                if batch_id != int(crash_at):
                    return commit(messages, batch_id)
                original = exactly_once.commit_all

                def first_then_die(admin, txns):
                    original(admin, txns[:1])
                    with open(os.environ[NOTE_ENV], "w") as f:   # the worker's stdout is captured
                        f.write(f"crashing after the marker of batch {batch_id}")
                    # The job was started in a session of its own; Spark's Python workers sit in
                    # process groups of their own inside it: kill the session's group (the driver).
                    os.killpg(os.getsid(0), signal.SIGKILL)
                    os.kill(os.getpid(), signal.SIGKILL)
                exactly_once.commit_all = first_then_die
                try:
                    return commit(messages, batch_id)
                finally:
                    exactly_once.commit_all = original
            writer.commit = commit_then_crash
        return writer


def slow(value):
    time.sleep(0.004)          # 300 rows: a batch takes over a second, so a kill lands inside one
    return b"copied:" + value


def main() -> None:
    from pyspark.sql import functions as F

    from tests.spark.conftest import spark_session
    bootstrap, source, target, ckpt, mode = sys.argv[1:6]
    if mode.startswith("crash-after-marker:"):
        os.environ[CRASH_ENV] = mode.split(":", 1)[1]
        os.environ[NOTE_ENV] = ckpt + ".crashed"
    spark = spark_session("eos-stream")
    spark.dataSource.register(CrashingSink)
    df = (spark.readStream.format("odradek").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", source).option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "300")
          .option("kafka.isolation.level", "read_committed").load())
    out = df.select("key", F.udf(slow, "binary")("value").alias("value"), "partition")
    writer = (out.writeStream.format("odradek_crashing").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", target).option("exactlyOnce", "true").option("kafka.transaction.timeout.ms", "60000")
              .option("checkpointLocation", ckpt))
    if mode == "available-now":
        q = writer.trigger(availableNow=True).start()
    else:
        q = writer.trigger(processingTime="100 milliseconds").start()
    print(f"query {q.id} started", flush=True)
    q.awaitTermination()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")


if __name__ == "__main__":
    main()
