"""odradek's Python client vs confluent-kafka (librdkafka), against the same odradek broker.

Run by hand from the repository root:

    python bench/client_bench.py                  # 3 rounds, best of each, ratios at the end
    python bench/client_bench.py --rounds 1 --records 100000

Workloads (records of random bytes, no keys, no compression, acks=1, linger.ms=5, batch.size=1 MiB,
no idempotence, one partition per topic, a fresh topic per run):

* produce 100 B and 1 KiB: records/s from the first send until every record is acknowledged.
  Ours: `await Producer.send()` per record (the asyncio API as an application uses it);
  confluent: `produce()` with `poll(0)` on BufferError, then `flush()`.
* consume 100 B and 1 KiB: read the whole pre-produced topic from offset 0.
  Ours: the batch-level path (`Consumer.fetch_batches`, counting `records_count` of whole batches);
  also our per-record path (`getmany`), for information. confluent: `consume(10000, 0.5)` with
  `fetch.queue.backoff.ms=1` (COMPAT-NOTES: librdkafka otherwise pauses fetching).

Producer and consumer rounds alternate ours and confluent's, so both see the same machine state; the best
round of each counts (least disturbed by other load). Targets (issue): produce >= 0.5x librdkafka at
100 B and >= 0.8x at 1 KiB; batch consume >= 1.0x.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
import uuid

import brokers

from odradek.client import Consumer, Producer, TopicPartition

QUIET = {"log_level": 3}
COMMON = {"linger.ms": 5, "batch.size": 1 << 20, "acks": 1}


def cpu_s() -> float:
    """CPU seconds of this process, all threads (librdkafka's included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------------------ produce
async def _ours_produce(bootstrap: str, topic: str, size: int, n: int) -> float:
    async with Producer({"bootstrap.servers": bootstrap, **COMMON, "enable.idempotence": False,
                         "buffer.memory": 64 << 20}) as p:
        value = os.urandom(size)
        await (await p.send(topic, value))       # metadata and connection before the clock starts
        send = p.send
        start, cpu0 = time.perf_counter(), cpu_s()
        for _ in range(n):
            await send(topic, value)
        await p.flush()
        return time.perf_counter() - start, cpu_s() - cpu0


def ours_produce(bootstrap: str, size: int, n: int) -> tuple[float, str]:
    topic = topic_name("ours-p")
    wall, cpu = asyncio.run(_ours_produce(bootstrap, topic, size, n))
    return (n / wall, n / cpu), topic


def confluent_produce(bootstrap: str, size: int, n: int) -> tuple[float, str]:
    from confluent_kafka import Producer as CProducer

    topic = topic_name("ck-p")
    p = CProducer({"bootstrap.servers": bootstrap, **COMMON, "compression.type": "none",
                   "enable.idempotence": False, "queue.buffering.max.messages": 500_000,
                   "queue.buffering.max.kbytes": 512 * 1024, "delivery.report.only.error": True, **QUIET})
    value = os.urandom(size)
    p.produce(topic, value)
    assert p.flush(30) == 0
    start, cpu0 = time.perf_counter(), cpu_s()
    produce = p.produce
    for _ in range(n):
        try:
            produce(topic, value)
        except BufferError:
            p.poll(0.001)
            produce(topic, value)
    assert p.flush(60) == 0, "confluent producer did not deliver"
    return (n / (time.perf_counter() - start), n / (cpu_s() - cpu0)), topic


# ------------------------------------------------------------------------------------------ consume
async def _ours_consume(bootstrap: str, topic: str, expected: int, batches: bool) -> float:
    async with Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition(topic, 0)])
        await c.position(TopicPartition(topic, 0))
        got = 0
        start, cpu0 = time.perf_counter(), cpu_s()
        while got < expected:
            if batches:
                for b in await c.fetch_batches(timeout_ms=5000):
                    got += b.next_offset - b.first_offset
            else:
                for records in (await c.getmany(timeout_ms=5000, max_records=10000)).values():
                    got += len(records)
        return time.perf_counter() - start, cpu_s() - cpu0


def ours_consume(bootstrap: str, topic: str, expected: int, batches: bool) -> float:
    wall, cpu = asyncio.run(_ours_consume(bootstrap, topic, expected, batches))
    return expected / wall, expected / cpu


def confluent_consume(bootstrap: str, topic: str, expected: int) -> float:
    from confluent_kafka import OFFSET_BEGINNING, Consumer as CConsumer, TopicPartition as CTP

    c = CConsumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                   "enable.auto.commit": False, "enable.auto.offset.store": False,
                   "fetch.queue.backoff.ms": 1, **QUIET})
    try:
        c.list_topics(topic, timeout=10)
        got = 0
        start, cpu0 = time.perf_counter(), cpu_s()
        c.assign([CTP(topic, 0, OFFSET_BEGINNING)])
        while got < expected:
            for m in c.consume(min(10_000, expected - got), 0.5):
                if m.error() is not None:
                    raise RuntimeError(f"consume error: {m.error()}")
                got += 1
        return expected / (time.perf_counter() - start), expected / (cpu_s() - cpu0)
    finally:
        c.close()


# ------------------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=0, help="records per run (default 500000 at 100 B, "
                    "200000 at 1 KiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bootstrap", help="use a running broker instead of starting one")
    ap.add_argument("--only", choices=["produce", "consume"], help="one side only (consume still "
                    "produces its topic, with our producer, untimed)")
    ap.add_argument("--sizes", default="100,1024", help="record sizes in bytes (default 100,1024)")
    args = ap.parse_args()
    broker = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        brokers.install_cleanup()
        broker = brokers.Broker("odradek", brokers.default_command("odradek"))
        broker.start()
        bootstrap = broker.bootstrap
    results: dict[str, dict[str, list]] = {}

    def record(name: str, who: str, rates: tuple[float, float]) -> None:
        best = results.setdefault(name, {}).setdefault(who, [0.0, 0.0])
        best[0] = max(best[0], rates[0])
        best[1] = max(best[1], rates[1])

    try:
        for size in (int(x) for x in args.sizes.split(",")):
            n = args.records or (500_000 if size <= 100 else 200_000)
            label = f"{size} B" if size != 1024 else "1 KiB"
            for r in range(args.rounds):
                b0 = broker.cpu_seconds() if broker else 0.0
                ours, topic = ours_produce(bootstrap, size, n)
                if args.only != "consume":
                    b1 = broker.cpu_seconds() if broker else 0.0
                    theirs, _ = confluent_produce(bootstrap, size, n)
                    b2 = broker.cpu_seconds() if broker else 0.0
                    record(f"produce {label}", "ours", ours)
                    record(f"produce {label}", "librdkafka", theirs)
                    print(f"round {r + 1} produce {label}: ours {ours[0]:,.0f}/s, librdkafka {theirs[0]:,.0f}/s"
                          + (f" (broker CPU s per 100k records: ours {(b1 - b0) * 1e5 / n:.2f}, "
                             f"librdkafka {(b2 - b1) * 1e5 / n:.2f})" if broker else ""), flush=True)
                if args.only == "produce":
                    continue
                expected = n + 1
                ours_b = ours_consume(bootstrap, topic, expected, batches=True)
                theirs_c = confluent_consume(bootstrap, topic, expected)
                ours_r = ours_consume(bootstrap, topic, expected, batches=False)
                record(f"consume {label} (batches)", "ours", ours_b)
                record(f"consume {label} (batches)", "librdkafka", theirs_c)
                record(f"consume {label} (per record)", "ours", ours_r)
                record(f"consume {label} (per record)", "librdkafka", theirs_c)
                print(f"round {r + 1} consume {label}: ours batches {ours_b[0]:,.0f}/s, "
                      f"ours per record {ours_r[0]:,.0f}/s, librdkafka {theirs_c[0]:,.0f}/s", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    print()
    print("best round of each; 'per CPU s' divides by the client process's CPU time (all threads),")
    print("which is steadier than wall time on a busy machine")
    print(f"{'workload':<30} {'ours rec/s':>11} {'librdkafka':>11} {'ratio':>6}   "
          f"{'ours /CPU s':>12} {'librdkafka':>11} {'ratio':>6}")
    for name, r in results.items():
        o, t = r["ours"], r["librdkafka"]
        print(f"{name:<30} {o[0]:>11,.0f} {t[0]:>11,.0f} {o[0] / t[0]:>5.2f}x   "
              f"{o[1]:>12,.0f} {t[1]:>11,.0f} {o[1] / t[1]:>5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
