"""Transactions against idempotence on one odradek broker, reported as ratios (seed 003, "Message
Delivery Semantics"): confluent-kafka producing 1 KiB records idempotently, then transactionally with
100 and with 10,000 records per transaction (records/s as a ratio of idempotent produce); then a
read_committed consumer of the transactional topic against a read_uncommitted one (records/s ratio).

    python bench/txn_bench.py [--records 200000] [--rounds 3]

Topics are created before any clock starts, and each producer has its metadata (and, when
transactional, its producer id) before its clock starts, so the figures are the steady rate, not topic
creation. The three produce workloads alternate for --rounds rounds; the best round of each counts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import Broker, default_command, install_cleanup  # noqa: E402

VALUE = b"x" * 1024


def produce(bootstrap: str, topic: str, records: int, per_txn: int | None) -> float:
    from confluent_kafka import Producer
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20, "enable.idempotence": True}
    if per_txn:
        conf["transactional.id"] = f"bench-{topic}"
    p = Producer(conf)
    if per_txn:
        p.init_transactions(30)
    p.list_topics(topic, timeout=30)
    start = time.perf_counter()
    sent = 0
    while sent < records:
        n = min(per_txn or records, records - sent)
        if per_txn:
            p.begin_transaction()
        for _ in range(n):
            while True:
                try:
                    p.produce(topic, VALUE)
                    break
                except BufferError:
                    p.poll(0.01)
        if per_txn:
            p.commit_transaction(60)
        sent += n
    assert p.flush(60) == 0
    return records / (time.perf_counter() - start)


def create_topics(bootstrap: str, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        f.result(30)


def consume(bootstrap: str, topic: str, records: int, isolation: str) -> float:
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{isolation}", "isolation.level": isolation,
                  "enable.auto.commit": False, "fetch.queue.backoff.ms": 0})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    start = time.perf_counter()
    while got < records:
        got += sum(1 for m in c.consume(10_000, 1.0) if not m.error())
    rate = records / (time.perf_counter() - start)
    c.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    install_cleanup()
    broker = Broker("odradek", default_command("odradek"))
    broker.start()
    try:
        n = args.records
        create_topics(broker.bootstrap, [f"{w}-{r}" for w in ("idem", "txn100", "txn10k")
                                         for r in range(args.rounds)] + ["warmup", "warmup-txn"])
        produce(broker.bootstrap, "warmup", n, None)     # connections, page cache
        produce(broker.bootstrap, "warmup-txn", 1000, 100)
        idem = t100 = t10k = 0.0
        for r in range(args.rounds):
            idem = max(idem, produce(broker.bootstrap, f"idem-{r}", n, None))
            t100 = max(t100, produce(broker.bootstrap, f"txn100-{r}", n, 100))
            t10k = max(t10k, produce(broker.bootstrap, f"txn10k-{r}", n, 10_000))
        # Best of two, alternating, so neither isolation level is measured cold.
        uncommitted = committed = 0.0
        for _ in range(2):
            uncommitted = max(uncommitted, consume(broker.bootstrap, "txn100-0", n, "read_uncommitted"))
            committed = max(committed, consume(broker.bootstrap, "txn100-0", n, "read_committed"))
        print(f"records: {n} x 1 KiB")
        print(f"idempotent produce         {idem:10.0f} records/s  1.00")
        print(f"transactional, 100/txn     {t100:10.0f} records/s  {t100 / idem:.2f}")
        print(f"transactional, 10,000/txn  {t10k:10.0f} records/s  {t10k / idem:.2f}")
        print(f"read_uncommitted consume   {uncommitted:10.0f} records/s  1.00")
        print(f"read_committed consume     {committed:10.0f} records/s  {committed / uncommitted:.2f}")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
