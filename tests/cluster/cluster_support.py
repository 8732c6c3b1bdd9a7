"""A cluster for tests: a real ZooKeeper and N real `odradek serve` processes on loopback, each with
its own log dir, started, killed (SIGKILL) and restarted like any process; and a checker in the Jepsen
style that records what a producer had acknowledged and reports what a reader does not find
(acknowledged but lost) and what it finds twice (duplicated)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from odradek.cluster.local_zookeeper import LocalZooKeeper
from odradek.cluster.store import NoNodeError
from odradek.cluster.zookeeper_store import ZooKeeperStore
from tests.integration.conftest import Broker

CLUSTER_OVERRIDES = {
    "zookeeper.session.timeout.ms": 6000,
    "offsets.topic.replication.factor": 3,
    "replica.lag.time.max.ms": 4000,
    "controlled.shutdown.retry.backoff.ms": 200,
    "auto.create.topics.enable": "false",
}


def wait_for(what: str, condition: Callable[[], object], timeout: float = 60.0, interval: float = 0.1,
             state: Callable[[], object] | None = None) -> object:
    """Poll `condition` until it returns something truthy; fail with `what` at the deadline (and with
    what `state` says then, for a condition whose failure needs more than its name to explain)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as e:          # a broker going away mid-question: ask again
            last_error = e
        time.sleep(interval)
    said = ""
    if state is not None:
        try:
            said = f"; state: {state()}"
        except Exception as e:
            said = f"; state unknown: {e!r}"
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_error})"
                                                                          if last_error else "") + said)


class Cluster:
    def __init__(self, base: Path, zookeeper: LocalZooKeeper, size: int, overrides: dict | None = None) -> None:
        self.zookeeper = zookeeper
        self.brokers = [Broker(base / f"broker-{i}", {"broker.id": i, "zookeeper.connect": zookeeper.connect,
                                                      **CLUSTER_OVERRIDES, **(overrides or {})}, name=f"broker-{i}")
                        for i in range(size)]
        self._store: ZooKeeperStore | None = None

    def start(self) -> "Cluster":
        for b in self.brokers:
            b.start()
        wait_for("every broker registered", lambda: len(self.metadata().brokers) == len(self.brokers))
        return self

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.running)

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap})

    def metadata(self, topic: str | None = None):
        return self.admin().list_topics(topic=topic, timeout=10)

    def create_topic(self, name: str, partitions: int, replication: int, config: dict | None = None) -> None:
        # Right after a broker (re)joins, the controller moves or ZooKeeper returns, the controller's
        # view converges: a creation may meet NOT_CONTROLLER, too few registered brokers or a store not
        # reconnected yet (REQUEST_TIMED_OUT) for a moment; ask again.
        deadline = time.monotonic() + 30
        while True:
            admin = self.admin()       # kept alive until the answer comes
            futures = admin.create_topics([NewTopic(name, partitions, replication, config=config or {})],
                                          operation_timeout=30)
            try:
                futures[name].result(60)
                break
            except KafkaException as e:
                code = e.args[0].code()
                if code == KafkaError.TOPIC_ALREADY_EXISTS:
                    break
                if code not in (KafkaError.NOT_CONTROLLER, KafkaError.INVALID_REPLICATION_FACTOR,
                                KafkaError.REQUEST_TIMED_OUT) \
                        or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        wait_for(f"{name} led everywhere", lambda: self.partition_states(name) and all(
            p.leader >= 0 and len(p.isrs) == replication for p in self.partition_states(name).values()))

    def partition_states(self, topic: str) -> dict[int, "PartitionView"]:
        """Each partition's leader, ISR and replicas as ZooKeeper has them: the truth the controller
        and the leaders write (a broker cut off from the cluster may still answer Metadata with an
        old view, as Kafka's would)."""
        store = self._zookeeper_store()
        try:
            node, _ = store.get(f"/brokers/topics/{topic}")
        except NoNodeError:
            return {}
        out = {}
        for p, replicas in node["partitions"].items():
            try:
                st, _ = store.get(f"/brokers/topics/{topic}/partitions/{p}/state")
            except NoNodeError:
                continue
            out[int(p)] = PartitionView(st["leader"], list(st["isr"]), list(replicas))
        return out

    def _zookeeper_store(self) -> ZooKeeperStore:
        if self._store is None:
            self._store = ZooKeeperStore(self.zookeeper.connect, session_timeout_ms=10000).start()
        return self._store

    def leader_of(self, topic: str, partition: int) -> int:
        return self.partition_states(topic)[partition].leader

    def controller_id(self) -> int:
        return self.metadata().controller_id

    def shutdown(self) -> None:
        if self._store is not None:
            self._store.close()
        errors = []
        for b in self.brokers:
            try:
                b.shutdown_and_check()
            except AssertionError as e:
                errors.append(str(e))
        if errors:
            raise AssertionError("\n".join(errors))


@dataclass(frozen=True)
class PartitionView:
    leader: int
    isrs: list[int]
    replicas: list[int]


@dataclass
class Checker:
    """What was acknowledged, and what a read found."""
    acked: set[int] = field(default_factory=set)
    failed: int = 0

    def report(self, read: list[int]) -> tuple[set[int], dict[int, int]]:
        """(acknowledged but lost, duplicated: value -> times seen)."""
        counts = Counter(read)
        lost = {v for v in self.acked if v not in counts}
        duplicated = {v: n for v, n in counts.items() if n > 1}
        return lost, duplicated


class CountingProducer(threading.Thread):
    """A confluent-kafka producer writing 0, 1, 2, ... to a topic until stopped; the checker records
    every acknowledged value."""

    def __init__(self, bootstrap: str, topic: str, config: dict | None = None, rate_per_s: int = 2000) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.checker = Checker()
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "message.timeout.ms": 120000, "linger.ms": 5, **(config or {})})
        self.rate = rate_per_s
        self.stopping = threading.Event()
        self.sent = 0
        self.errors: list[str] = []

    def _delivered(self, err, msg) -> None:
        if err is None:
            self.checker.acked.add(int(msg.value()))
        else:
            self.checker.failed += 1
            if len(self.errors) < 20:
                self.errors.append(str(err))

    def run(self) -> None:
        start = time.monotonic()
        while not self.stopping.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while self.sent < due:
                try:
                    self.producer.produce(self.topic, str(self.sent).encode(), on_delivery=self._delivered)
                    self.sent += 1
                except BufferError:
                    break
            self.producer.poll(0.005)

    def stop(self, flush_s: float = 120.0) -> None:
        self.stopping.set()
        self.join(10)
        left = self.producer.flush(flush_s)
        assert left == 0, f"{left} record(s) neither acknowledged nor failed after {flush_s}s"

    def acked_count(self) -> int:
        return len(self.checker.acked)


def _high_watermark(c: Consumer, topic: str, p: int) -> tuple[int] | None:
    try:
        return (c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1],)
    except KafkaException as e:
        if e.args[0].retriable() or e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        raise


def read_all(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> list[int]:
    """Every record of the topic up to its high watermark, as integers."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        ends = {}
        for p in range(partitions):
            # A leader just elected may not have applied its LeaderAndIsr yet: retriable errors pass.
            ends[p] = wait_for(f"the high watermark of {topic}-{p}", lambda p=p: _high_watermark(c, topic, p), timeout)[0]
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[int] = []
        positions = {p: 0 for p in range(partitions)}
        deadline = time.monotonic() + timeout
        while any(positions[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"read {len(out)} record(s); positions {positions}, ends {ends}"
            for m in c.consume(1000, 1.0):
                if m.error():
                    raise KafkaException(m.error())
                out.append(int(m.value()))
                positions[m.partition()] = m.offset() + 1
        return out
    finally:
        c.close()
