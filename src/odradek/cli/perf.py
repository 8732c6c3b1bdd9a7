"""`odradek perf produce` and `odradek perf consume` (as kafka-producer-perf-test.sh and
kafka-consumer-perf-test.sh).

    odradek perf produce --topic perf --num-records 100000 --record-size 100 --throughput -1
    odradek perf consume --topic perf --messages 100000

produce sends records of --record-size random bytes, at most --throughput a second (-1: no cap), and
reports records/s, MB/s and the latency from send to acknowledgement (average, maximum, p50, p95, p99,
p99.9). consume reads every partition from the earliest offset until --messages records (or --timeout-ms
without one) and reports records/s and MB/s of keys plus values. A progress bar goes to stderr when it
is a terminal; the summary to stdout (--json for scripts).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from odradek.cli.common import (
    CliError, admin_config, client_config, connection_parent, json_parent, parse_key_values, positive_int,
    print_json, print_table, run,
)

MB = 1024 * 1024
PROGRESS_EVERY = 1000


def add_parser(sub) -> None:
    conn, js = connection_parent(), json_parent()
    p = sub.add_parser("perf", help="producer and consumer performance tests", description=__doc__)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    pp = actions.add_parser("produce", parents=[conn, js], help="as kafka-producer-perf-test")
    pp.add_argument("--topic", required=True)
    pp.add_argument("--num-records", type=positive_int, required=True)
    pp.add_argument("--record-size", type=positive_int, required=True, metavar="BYTES")
    pp.add_argument("--throughput", type=float, default=-1, metavar="RECORDS/S", help="a cap; -1 for none (default)")
    pp.add_argument("--acks", default="1", choices=["0", "1", "all", "-1"])
    pp.add_argument("--compression-codec", "--compression", default="none",
                    choices=["none", "gzip", "snappy", "lz4", "zstd"])
    pp.add_argument("--producer-props", nargs="+", default=[], metavar="KEY=VALUE", help="producer configs")
    pp.add_argument("--no-progress", action="store_true")
    pp.set_defaults(run=lambda a: run(a, perf_produce))

    pc = actions.add_parser("consume", parents=[conn, js], help="as kafka-consumer-perf-test")
    pc.add_argument("--topic", required=True)
    pc.add_argument("--messages", type=positive_int, required=True, help="stop after this many records")
    pc.add_argument("--timeout-ms", type=positive_int, default=10000, help="stop after this long without a record")
    pc.add_argument("--consumer-props", nargs="+", default=[], metavar="KEY=VALUE", help="consumer configs")
    pc.add_argument("--no-progress", action="store_true")
    pc.set_defaults(run=lambda a: run(a, perf_consume))


# ------------------------------------------------------------------------------------------ pure parts
def percentile(sorted_values, p: float) -> float:
    """Kafka's perf-test rule: the value at index int(n * p) of the sorted sample (clamped)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * p))]


def pace(sent: int, throughput: float, elapsed_s: float) -> float:
    """Seconds to wait before sending record number `sent` (0-based) to stay under `throughput`/s."""
    if throughput <= 0:
        return 0.0
    return max(0.0, sent / throughput - elapsed_s)


def produce_summary(records: int, record_size: int, seconds: float, latencies_ms: list[float]) -> dict:
    lat = sorted(latencies_ms)
    seconds = max(seconds, 1e-9)
    return {"records": records, "seconds": round(seconds, 3), "records_per_s": round(records / seconds, 1),
            "mb_per_s": round(records * record_size / MB / seconds, 2),
            "latency_avg_ms": round(sum(lat) / len(lat), 2) if lat else 0.0,
            "latency_max_ms": round(lat[-1], 2) if lat else 0.0,
            **{f"latency_p{name}_ms": round(percentile(lat, p), 2)
               for name, p in (("50", 0.5), ("95", 0.95), ("99", 0.99), ("99.9", 0.999))}}


# ------------------------------------------------------------------------------------------ progress
class _Progress:
    def __init__(self, total: int, what: str, disabled: bool) -> None:
        self.bar = None
        if disabled or not sys.stderr.isatty():
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from odradek.cli.common import console
        self.bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console(stderr=True), transient=True)
        self.task = self.bar.add_task(what, total=total)
        self.bar.start()

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


# ------------------------------------------------------------------------------------------ produce
async def perf_produce(args) -> int:
    from odradek.client.producer import Producer

    if args.throughput == 0:
        raise CliError("--throughput must be positive, or -1 for no cap", 2)
    timeout_ms = int(args.timeout * 1000)
    conf = client_config(args, **{"acks": args.acks, "compression.type": args.compression_codec,
                                  "max.block.ms": timeout_ms, **parse_key_values(args.producer_props, "--producer-props")})
    payload = bytes(65 + b % 26 for b in os.urandom(args.record_size))   # random capitals, as Kafka's
    n = args.num_records
    latencies: list[float] = []
    errors: list = []
    progress = _Progress(n, f"producing to {args.topic}", args.no_progress)

    def delivered(sent_at: float):
        def on_delivery(err, md) -> None:
            if err is not None:
                errors.append(err)
            else:
                latencies.append((time.perf_counter() - sent_at) * 1000)
        return on_delivery
    try:
        async with Producer(conf) as producer:
            await producer.partitions_for(args.topic)   # an unknown topic fails before the clock starts
            start = time.perf_counter()
            for i in range(n):
                wait = pace(i, args.throughput, time.perf_counter() - start)
                if wait > 0.001:
                    await asyncio.sleep(wait)
                await producer.send(args.topic, payload, on_delivery=delivered(time.perf_counter()))
                if i % PROGRESS_EVERY == 0:
                    progress.update(len(latencies) + len(errors))
                    if errors:
                        break
            await producer.flush()
            seconds = time.perf_counter() - start
    finally:
        progress.stop()
    if errors:
        raise CliError(f"{len(errors)} records failed; the first: {errors[0]}")
    summary = {"topic": args.topic, **produce_summary(len(latencies), args.record_size, seconds, latencies)}
    if args.json:
        print_json(summary)
    else:
        print_table(["", "VALUE"], [
            ("records", summary["records"]), ("records/s", summary["records_per_s"]), ("MB/s", summary["mb_per_s"]),
            ("latency avg ms", summary["latency_avg_ms"]), ("latency max ms", summary["latency_max_ms"]),
            ("latency p50 ms", summary["latency_p50_ms"]), ("latency p95 ms", summary["latency_p95_ms"]),
            ("latency p99 ms", summary["latency_p99_ms"]), ("latency p99.9 ms", summary["latency_p99.9_ms"])],
            title=f"Produced {summary['records']} records of {args.record_size} bytes to {args.topic} "
                  f"in {summary['seconds']} s")
    return 0


# ------------------------------------------------------------------------------------------ consume
async def perf_consume(args) -> int:
    from odradek.client.admin import Admin
    from odradek.client.consumer import Consumer
    from odradek.client.fetcher import TopicPartition

    async with Admin(admin_config(args)) as admin:
        count = len((await admin.describe_topics([args.topic]))[args.topic].partitions)
    conf = client_config(args, **{"auto.offset.reset": "earliest", "allow.auto.create.topics": False,
                                  **parse_key_values(args.consumer_props, "--consumer-props")})
    records = size = 0
    progress = _Progress(args.messages, f"consuming from {args.topic}", args.no_progress)
    try:
        async with Consumer(conf) as consumer:
            consumer.assign([TopicPartition(args.topic, p) for p in range(count)])
            start = last = time.perf_counter()
            while records < args.messages:
                got = await consumer.fetch_batches(timeout_ms=200)
                now = time.perf_counter()
                if not got:
                    if (now - last) * 1000 >= args.timeout_ms:
                        break
                    continue
                last = now
                for b in got:
                    for r in b.records(check_crc=False):
                        records += 1
                        size += (len(r.key) if r.key is not None else 0) + (len(r.value) if r.value is not None else 0)
                progress.update(records)
            seconds = max(last - start, 1e-9)
    finally:
        progress.stop()
    summary = {"topic": args.topic, "records": records, "mb": round(size / MB, 4), "seconds": round(seconds, 3),
               "records_per_s": round(records / seconds, 1), "mb_per_s": round(size / MB / seconds, 2)}
    if args.json:
        print_json(summary)
    else:
        print_table(["", "VALUE"], [
            ("records", records), ("MB", summary["mb"]), ("seconds", summary["seconds"]),
            ("records/s", summary["records_per_s"]), ("MB/s", summary["mb_per_s"])],
            title=f"Consumed {records} records from {args.topic} in {summary['seconds']} s")
    if records < args.messages:
        print(f"only {records} of {args.messages} records arrived within --timeout-ms {args.timeout_ms}",
              file=sys.stderr)
    return 0
