"""Online migration of a live group between the classic and the consumer protocol (seed 002, KIP-848;
Kafka's group.consumer.migration.policy, bidirectional by default): a rolling upgrade replaces classic
members (librdkafka with group.protocol=classic, kafka-python) one by one with librdkafka members of
group.protocol=consumer while a producer runs, then a rolling downgrade goes back. The broker's view is
sampled all along; no partition is ever owned by two members (their callbacks' intervals) nor in two
members' assignments at a sampled moment; every acknowledged record is processed."""

from __future__ import annotations

import time

from confluent_kafka.admin import AdminClient

from .groups_support import describe_group
from .groups_support import (
    GROUP_REQUEST_LOGGERS, Member, ProducerThread, assert_no_two_owners, assert_nothing_skipped, create_topic,
    describe, wait_caught_up, wait_stable,
)
from .test_consumer_group_protocol import Sampler

BROKER_OVERRIDES = {
    "group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000,
    "group.consumer.session.timeout.ms": 6000, "group.consumer.min.session.timeout.ms": 1000,
    "group.consumer.heartbeat.interval.ms": 500, "group.consumer.min.heartbeat.interval.ms": 100,
}
BROKER_LOGGERS = GROUP_REQUEST_LOGGERS
PARTITIONS = 6


def group_type(admin: AdminClient, group: str) -> str:
    return describe_group(admin, group).type.name


def test_rolling_upgrade_then_downgrade_keeps_consuming(broker, tmp_path, record_property):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic, group = "migrate-orders", "migrate-billing"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    producer = ProducerThread(broker.bootstrap, topic, PARTITIONS, rate_per_s=300)
    everyone: list[Member] = []
    sampler = None
    steps: dict[str, float] = {}

    def start(client: str, name: str, run: int, protocol: str | None) -> Member:
        m = Member(client, broker.bootstrap, topic, group, name, tmp_path, run=run, group_protocol=protocol)
        everyone.append(m)
        return m

    def replace(live: list[Member], old: Member, client: str, protocol: str | None, run: int) -> list[Member]:
        old.close()
        new = start(client, old.name, run, protocol)
        rest = [m for m in live if m is not old] + [new]
        t0 = time.time()
        steps[f"{old.label}->{new.label}"] = wait_stable(admin, group, rest, PARTITIONS, 60) - t0
        return rest

    try:
        live = [start("confluent", "a", 1, "classic"), start("confluent", "b", 1, "classic"),
                start("kafka-python", "k", 1, None)]
        wait_stable(admin, group, live, PARTITIONS, 60)
        assert group_type(admin, group) == "CLASSIC"
        sampler = Sampler(admin, group)
        log_at = broker.log_size()
        # Rolling upgrade: the first consumer-protocol member converts the group.
        live = replace(live, live[0], "confluent", "consumer", 2)
        assert group_type(admin, group) == "CONSUMER"
        live = replace(live, live[0], "confluent", "consumer", 2)
        live = replace(live, live[0], "confluent", "consumer", 2)
        assert group_type(admin, group) == "CONSUMER"
        # Rolling downgrade: the last consumer-protocol member to go converts it back.
        live = replace(live, live[0], "confluent", "classic", 3)
        live = replace(live, live[0], "kafka-python", None, 3)
        live = replace(live, live[0], "confluent", "classic", 3)
        assert group_type(admin, group) == "CLASSIC"
        log = broker.log_text(log_at)
        assert log.count(f"group {group}: converting the classic group") == 1, "upgraded more than once"
        assert log.count(f"group {group}: the last member using the consumer protocol") == 1
        state, view = describe(admin, group)
        assert state == "STABLE" and sorted(p for ps in view.values() for p in ps) == list(range(PARTITIONS))

        acked = producer.stop()
        wait_caught_up(admin, group, topic, acked, 60, live)
        sampler.stop()
        for m in live:
            m.close()
        assert_no_two_owners(everyone, {})
        assert_nothing_skipped(acked, everyone)
        for step, seconds in steps.items():
            record_property(step, round(seconds, 2))
        print(", ".join(f"{k} {v:.2f}s" for k, v in steps.items()),
              f"; {sampler.samples} samples of the broker's view; {sum(len(v) for v in acked.values())} records")
    finally:
        producer.abandon()
        if sampler is not None:
            sampler._stop.set()
        for m in everyone:
            if m.alive:
                m.kill()
