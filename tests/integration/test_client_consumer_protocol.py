"""odradek's consumer with group.protocol=consumer (seed 002, KIP-848) against a real broker, in one
group with librdkafka consumer-protocol members: both consume a shared topic while a producer runs,
members join and leave, the partitions split between them, no partition is ever owned by two members
(their callbacks) nor in two assignments at a sampled moment of the broker's view, nothing acknowledged
is left unprocessed. In process: static membership (a restart within the session keeps the member's
partitions with no new epoch), a regex subscription resolved by the coordinator, the server assignor
chosen with group.remote.assignor, commits fenced by member epoch."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka.admin import AdminClient

from odradek.client import Consumer, TopicPartition

from .groups_support import (
    Member, ProducerThread, assert_no_two_owners, assert_nothing_skipped, create_topic, describe, wait_caught_up,
    wait_stable,
)
from .test_client_groups import OurMember
from .test_consumer_group_protocol import Sampler

BROKER_OVERRIDES = {
    "group.consumer.session.timeout.ms": 6000, "group.consumer.min.session.timeout.ms": 1000,
    "group.consumer.heartbeat.interval.ms": 500, "group.consumer.min.heartbeat.interval.ms": 100,
}
PARTITIONS = 6


def test_ours_and_librdkafka_share_a_topic(broker, tmp_path, record_property):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic, group = "kip848-client-shared", "kip848-client-group"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = ProducerThread(broker.bootstrap, topic, PARTITIONS, rate_per_s=300)
    everyone: list[Member] = []
    sampler = None

    def ours(name: str, run: int = 1) -> Member:
        m = OurMember(broker.bootstrap, topic, group, name, tmp_path, run=run, group_protocol="consumer")
        everyone.append(m)
        return m

    def theirs(name: str, run: int = 1) -> Member:
        m = Member("confluent", broker.bootstrap, topic, group, name, tmp_path, run=run, group_protocol="consumer")
        everyone.append(m)
        return m

    try:
        o1, r1 = ours("o1"), theirs("r1")
        wait_stable(admin, group, [o1, r1], PARTITIONS, 60)
        sampler = Sampler(admin, group)
        assert sorted(len(m.owned()) for m in (o1, r1)) == [3, 3]
        o2 = ours("o2")
        wait_stable(admin, group, [o1, r1, o2], PARTITIONS, 60)
        assert sorted(len(m.owned()) for m in (o1, r1, o2)) == [2, 2, 2]
        r1.close()                                   # librdkafka leaves: ours take its partitions
        wait_stable(admin, group, [o1, o2], PARTITIONS, 60)
        r2 = theirs("r2")
        o1.close()                                   # ours leaves (epoch -1) while librdkafka joins
        wait_stable(admin, group, [o2, r2], PARTITIONS, 60)
        acked = producer.stop()
        wait_caught_up(admin, group, topic, acked, 60, [o2, r2])
        sampler.stop()
        for m in (o2, r2):
            m.close()
        assert_no_two_owners(everyone, {})
        assert_nothing_skipped(acked, everyone)
        print(f"{sampler.samples} samples of the broker's view; {sum(len(v) for v in acked.values())} records")
    finally:
        producer.abandon()
        if sampler is not None:
            sampler._stop.set()
        for m in everyone:
            if m.alive:
                m.kill()


async def _until(consumer: Consumer, check, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not reached: assignment {sorted(consumer.assignment())}"
        await consumer.getmany(timeout_ms=50)


def test_static_member_restart_regex_and_remote_assignor(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(broker.bootstrap, "kip848-static", 4)
    create_topic(broker.bootstrap, "rx848-one", 2)

    async def main() -> None:
        conf = {"bootstrap.servers": broker.bootstrap, "group.id": "kip848-static-group", "group.protocol": "consumer",
                "group.instance.id": "box-1", "group.remote.assignor": "range", "client.id": "static",
                "enable.auto.commit": False, "auto.offset.reset": "earliest"}
        a = Consumer(conf)
        await a.start()
        a.subscribe(["kip848-static"])
        await _until(a, lambda: len(a.assignment()) == 4)
        epoch = a._membership.member_epoch
        await a.commit({TopicPartition("kip848-static", 0): 7})
        await a.aclose()                              # a static member leaves with epoch -2: it keeps its place
        b = Consumer(conf)
        await b.start()
        b.subscribe(["kip848-static"])
        await _until(b, lambda: len(b.assignment()) == 4)
        assert b._membership.member_epoch == epoch, "the restarted static member got a new epoch"
        assert (await b.committed([TopicPartition("kip848-static", 0)]))[TopicPartition("kip848-static", 0)] == 7
        state, view = describe(admin, "kip848-static-group")
        assert state == "STABLE" and view == {"static": [0, 1, 2, 3]}
        await b.aclose()

        r = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "kip848-regex-ours",
                      "group.protocol": "consumer", "metadata.max.age.ms": 1000})
        await r.start()
        r.subscribe(pattern="rx848-.*")
        await _until(r, lambda: {tp.topic for tp in r.assignment()} == {"rx848-one"})
        create_topic(broker.bootstrap, "rx848-two", 3)
        await _until(r, lambda: len(r.assignment()) == 5)
        await r.aclose()

    asyncio.run(main())
