"""Transactional produce through odradek.client against confluent-kafka's transactional producer
(librdkafka), side by side on one odradek broker in the same run, reported as ratios ours/confluent
(seed 003, "Message Delivery Semantics"). Also each client's read_committed consume of a topic where a
third of the transactions were aborted, and our read_committed consume as a ratio of our
read_uncommitted consume of the same topic (the cost of dropping aborted batches and markers).

    python bench/txn_client_bench.py [--records 100000] [--size 1024]

Produce: `--records` records of `--size` bytes in transactions of 100 and of 10,000 records (begin,
send, commit; the clock runs until the last commit returns). Each figure is the best of two runs,
the clients alternating, so neither is measured cold.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import Broker, default_command, install_cleanup  # noqa: E402


def confluent_produce(bootstrap: str, topic: str, n: int, per_txn: int, value: bytes, abort_every: int = 0) -> float:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                  "transactional.id": f"bench-ck-{topic}"})
    p.init_transactions(30)
    start = time.perf_counter()
    sent = t = 0
    while sent < n:
        k = min(per_txn, n - sent)
        p.begin_transaction()
        for _ in range(k):
            while True:
                try:
                    p.produce(topic, value)
                    break
                except BufferError:
                    p.poll(0.01)
        if abort_every and t % abort_every == abort_every - 1:
            p.flush(60)
            p.abort_transaction(60)
        else:
            p.commit_transaction(60)
        sent += k
        t += 1
    return n / (time.perf_counter() - start)


def ours_produce(bootstrap: str, topic: str, n: int, per_txn: int, value: bytes, abort_every: int = 0) -> float:
    from odradek.client import Producer

    async def run() -> float:
        async with Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                             "transactional.id": f"bench-ours-{topic}"}) as p:
            await p.init_transactions(30)
            start = time.perf_counter()
            sent = t = 0
            while sent < n:
                k = min(per_txn, n - sent)
                p.begin_transaction()
                for _ in range(k):
                    await p.send(topic, value)
                if abort_every and t % abort_every == abort_every - 1:
                    await p.flush()
                    await p.abort_transaction(60)
                else:
                    await p.commit_transaction(60)
                sent += k
                t += 1
            return n / (time.perf_counter() - start)
    return asyncio.run(run())


def confluent_consume(bootstrap: str, topic: str, expected: int) -> float:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.monotonic_ns()}",
                  "isolation.level": "read_committed", "enable.auto.commit": False, "fetch.queue.backoff.ms": 0})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.perf_counter()
    while got < expected:
        got += sum(1 for m in c.consume(10_000, 1.0) if not m.error())
    rate = expected / (time.perf_counter() - start)
    c.close()
    return rate


def ours_consume(bootstrap: str, topic: str, expected: int, isolation: str) -> float:
    from odradek.client import Consumer, TopicPartition

    async def run() -> float:
        async with Consumer({"bootstrap.servers": bootstrap, "isolation.level": isolation,
                             "auto.offset.reset": "earliest", "max.poll.records": 10_000}) as c:
            c.assign([TopicPartition(topic, 0)])
            got = 0
            start = time.perf_counter()
            while got < expected:
                for records in (await c.getmany(timeout_ms=1000)).values():
                    got += len(records)
            return expected / (time.perf_counter() - start)
    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024)
    args = ap.parse_args()
    install_cleanup()
    broker = Broker("odradek", default_command("odradek"))
    broker.start()
    value = b"x" * args.size
    n = args.records
    bs = broker.bootstrap
    try:
        ours_produce(bs, "warm-ours", 2000, 100, value)        # topic creation, connections, page cache
        confluent_produce(bs, "warm-ck", 2000, 100, value)
        rows = []
        for per_txn in (100, 10_000):
            best = {"ours": 0.0, "confluent": 0.0}
            for r in range(2):
                for who in (("ours", "confluent") if r == 0 else ("confluent", "ours")):
                    fn = ours_produce if who == "ours" else confluent_produce
                    best[who] = max(best[who], fn(bs, f"p{per_txn}-{who}-{r}", n, per_txn, value))
            rows.append((f"transactional produce, {per_txn}/txn", best["ours"], best["confluent"]))
        # A topic with every third transaction aborted, for the read_committed figures.
        ours_produce(bs, "mixed", n, 1000, value, abort_every=3)
        committed = n - (n // 1000 // 3) * 1000
        best = {"ours": 0.0, "confluent": 0.0, "ours-ru": 0.0}
        for _ in range(2):
            best["ours"] = max(best["ours"], ours_consume(bs, "mixed", committed, "read_committed"))
            best["confluent"] = max(best["confluent"], confluent_consume(bs, "mixed", committed))
            best["ours-ru"] = max(best["ours-ru"], ours_consume(bs, "mixed", n, "read_uncommitted"))
        rows.append(("read_committed consume (1/3 aborted)", best["ours"], best["confluent"]))
        print(f"records: {n} x {args.size} B; records/s, ours / confluent-kafka")
        print(f"{'workload':40s} {'ours':>12s} {'confluent':>12s} {'ratio':>6s}")
        for name, ours, ck in rows:
            print(f"{name:40s} {ours:12.0f} {ck:12.0f} {ours / ck:6.2f}")
        print(f"ours: read_committed {best['ours']:.0f} records/s vs read_uncommitted {best['ours-ru']:.0f} "
              f"records/s of the same log (ratio {best['ours'] / best['ours-ru']:.2f}; read_uncommitted hands "
              f"out {n} records, read_committed {committed})")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
