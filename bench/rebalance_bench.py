"""Rebalance time of one member joining a group of 10 under load, classic against consumer protocol
(seed 002, KIP-848: "the rebalance is incremental and no longer a global synchronisation barrier"),
in one run on one odradek broker, reported as ratios of the classic eager protocol.

Ten librdkafka consumers share a 30-partition topic while a producer writes 2,000 records/s and every
member consumes; an eleventh joins. The time measured runs from its subscribe() until the group has
settled again: the newcomer owns partitions, every partition has exactly one owner (as the members'
own rebalance callbacks say) and all 30 are owned. Also measured: how long the ten others together
owned nothing they were consuming (partition-seconds without an owner, summed), the eager protocol's
stop-the-world cost. Heartbeat intervals are equal (1 s) for both protocols.

    python bench/rebalance_bench.py [--trials 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import Broker, default_command, install_cleanup  # noqa: E402

PARTITIONS = 30
MEMBERS = 10
HEARTBEAT_MS = 1000
RATE_PER_S = 2000
OVERRIDES = (f" --override group.consumer.heartbeat.interval.ms={HEARTBEAT_MS}"
             " --override group.consumer.min.heartbeat.interval.ms=100"
             " --override group.initial.rebalance.delay.ms=0")
PROTOCOLS = {   # name -> librdkafka settings
    "classic eager (range)": {"partition.assignment.strategy": "range", "heartbeat.interval.ms": HEARTBEAT_MS},
    "classic cooperative-sticky": {"partition.assignment.strategy": "cooperative-sticky",
                                   "heartbeat.interval.ms": HEARTBEAT_MS},
    "consumer (KIP-848)": {"group.protocol": "consumer"},
}


class Member:
    def __init__(self, bootstrap: str, topic: str, group: str, settings: dict) -> None:
        from confluent_kafka import Consumer
        self.owned: set[int] = set()
        self.incremental = settings.get("group.protocol") == "consumer" \
            or settings.get("partition.assignment.strategy") == "cooperative-sticky"
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "latest",
                           "enable.auto.commit": True, **settings})
        self.c.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke, on_lost=self._revoke)

    def _assign(self, consumer, partitions) -> None:
        self.owned |= {tp.partition for tp in partitions}
        if self.incremental:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)

    def _revoke(self, consumer, partitions) -> None:
        self.owned -= {tp.partition for tp in partitions}
        if self.incremental:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def poll(self) -> None:
        self.c.consume(1000, 0)


def settled(members: list[Member]) -> bool:
    owned = [p for m in members for p in m.owned]
    return len(owned) == len(set(owned)) == PARTITIONS and all(m.owned for m in members)


def orphaned(members: list[Member]) -> int:
    owned = {p for m in members for p in m.owned}
    return PARTITIONS - len(owned)


def trial(bootstrap: str, topic: str, group: str, settings: dict) -> tuple[float, float]:
    """(seconds until the group settled after the eleventh member subscribed, partition-seconds unowned)."""
    members = [Member(bootstrap, topic, group, settings) for _ in range(MEMBERS)]
    try:
        deadline = time.monotonic() + 120
        while not settled(members):
            assert time.monotonic() < deadline, "the ten did not settle"
            for m in members:
                m.poll()
        for _ in range(int(2 * HEARTBEAT_MS / 10)):   # a quiet period: every member at steady state
            for m in members:
                m.poll()
            time.sleep(0.01)
        start = time.monotonic()
        members.append(Member(bootstrap, topic, group, settings))
        unowned = 0.0
        last = start
        while not settled(members):
            assert time.monotonic() < start + 120, "the eleventh never settled"
            for m in members:
                m.poll()
            now = time.monotonic()
            unowned += orphaned(members) * (now - last)
            last = now
        return time.monotonic() - start, unowned
    finally:
        for m in members:
            m.c.close()


def produce(bootstrap: str, topic: str, stop: threading.Event) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    i = 0
    while not stop.is_set():
        p.produce(topic, b"%d" % i, partition=i % PARTITIONS)
        i += 1
        p.poll(0)
        time.sleep(1 / RATE_PER_S)
    p.flush(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    install_cleanup()
    from confluent_kafka.admin import AdminClient, NewTopic
    broker = Broker("odradek", default_command("odradek") + OVERRIDES)
    broker.start()
    stop = threading.Event()
    producer = None
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in admin.create_topics([NewTopic("rebalance", PARTITIONS, 1)]).values():
            f.result(30)
        producer = threading.Thread(target=produce, args=(broker.bootstrap, "rebalance", stop), daemon=True)
        producer.start()
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in PROTOCOLS}
        for t in range(args.trials):          # interleaved, so no protocol always runs on a warmer broker
            for name, settings in PROTOCOLS.items():
                group = f"bench-{name.split()[0]}-{t}-{len(results[name])}-{abs(hash(name)) % 1000}"
                results[name].append(trial(broker.bootstrap, "rebalance", group, settings))
        base = statistics.median(s for s, _ in results["classic eager (range)"])
        print(f"one member joins {MEMBERS} (30 partitions, {RATE_PER_S} records/s, heartbeat {HEARTBEAT_MS} ms), "
              f"median of {args.trials}:")
        for name, runs in results.items():
            secs = statistics.median(s for s, _ in runs)
            unowned = statistics.median(u for _, u in runs)
            print(f"  {name:28s} {secs:6.2f} s  {secs / base:5.2f}x   unowned {unowned:7.2f} partition-s   "
                  f"runs {[round(s, 2) for s, _ in runs]}")
    finally:
        stop.set()
        if producer is not None:
            producer.join(30)
        broker.stop()


if __name__ == "__main__":
    main()
