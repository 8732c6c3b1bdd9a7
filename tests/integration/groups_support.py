"""Consumer-group test support: a consumer *process* per member, and the checks the group tests share.

`python groups_support.py --client confluent|kafka-python|aiokafka --bootstrap H:P --topic T --group G
--name N --events FILE [--instance-id I] [--strategy S]` runs one consumer until SIGTERM (then it closes
cleanly: LeaveGroup for dynamic members) or SIGKILL. It appends JSON lines to FILE:

    {"e": "assigned" | "revoked" | "lost", "p": [partitions], "ts": ...}   rebalance callbacks
    {"e": "r", "p": partition, "o": offset}                                 a processed record
    {"e": "committed", "p": {partition: offset}}                            a successful commit
    {"e": "started" | "stopping" | "closed", "ts": ...}   stopping: no more processing from here

Records are written (and flushed) before their offsets are committed, so a record whose commit
succeeded is always in the file, even after kill -9. Nothing here imports odradek.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

COMMIT_INTERVAL_S = 0.2
SESSION_TIMEOUT_MS = 6000
# The broker's request log for the group APIs: what a failing group test shows of the conversation.
GROUP_REQUEST_LOGGERS = {f"odradek.requests.completed.{api}": "DEBUG"
                         for api in ("FindCoordinator", "JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup")}
HEARTBEAT_INTERVAL_MS = 500


# ------------------------------------------------------------------------------------------ worker
class Events:
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)

    def emit(self, event: str, **fields) -> None:
        self.f.write(json.dumps({"e": event, "ts": time.time(), **fields}) + "\n")

    def records(self, pairs) -> None:
        self.f.write("".join(json.dumps({"e": "r", "p": p, "o": o}) + "\n" for p, o in pairs))
        self.f.flush()


class Worker:
    """The loop all three clients share: poll, log, commit what was processed every 200 ms and on
    revocation."""

    def __init__(self, args) -> None:
        self.args = args
        self.events = Events(args.events)
        self.stop = False
        self.processed: dict[int, int] = {}      # partition -> next offset, not yet committed
        # Progress on revoked partitions, not committed: a member that gets a partition back keeps its
        # position (Java's rule, which kafka-python 3 follows), so nobody would process those records
        # again; the progress is restored, and committed, when the partition comes back.
        self.parked: dict[int, int] = {}
        self.lock = threading.RLock()            # kafka-python 3 runs listeners on its own thread
        self.last_commit = time.monotonic()
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stop", True))

    def on_records(self, pairs) -> None:
        if pairs:
            self.events.records(pairs)
            with self.lock:
                for p, o in pairs:
                    self.processed[p] = o + 1

    def due(self) -> bool:
        return bool(self.processed) and time.monotonic() - self.last_commit >= COMMIT_INTERVAL_S

    def to_commit(self) -> dict[int, int]:
        with self.lock:
            return dict(self.processed)

    def committed(self, offsets: dict[int, int]) -> None:
        self.last_commit = time.monotonic()
        self.events.emit("committed", p={str(k): v for k, v in offsets.items()})
        with self.lock:
            for p, o in offsets.items():
                if self.processed.get(p) == o:
                    del self.processed[p]

    def commit(self, do_commit, errors) -> None:
        """Commit what was processed with `do_commit(offsets)`; `errors` are the client's failures."""
        offsets = self.to_commit()
        if not offsets:
            return
        try:
            do_commit(offsets)
            self.committed(offsets)
        except errors as e:
            self.commit_failed(repr(e))

    async def commit_async(self, do_commit, errors) -> None:
        """`commit` for a client whose commit is a coroutine."""
        offsets = self.to_commit()
        if not offsets:
            return
        try:
            await do_commit(offsets)
            self.committed(offsets)
        except errors as e:
            self.commit_failed(repr(e))

    def commit_failed(self, error: str) -> None:
        """Kept for the next try: the partitions may stay ours (a rebalance that gives them back)."""
        self.last_commit = time.monotonic()
        self.events.emit("commit_failed", error=error)

    def assigned(self, partitions: list[int], **extra) -> None:
        self.events.emit("assigned", p=partitions, **extra)
        with self.lock:
            for p in partitions:
                if p in self.parked and p not in self.processed:
                    self.processed[p] = self.parked[p]
            self.parked.clear()

    def revoked(self, partitions: list[int]) -> None:
        self.events.emit("revoked", p=partitions)
        with self.lock:
            for p in partitions:
                if p in self.processed:
                    self.parked[p] = self.processed.pop(p)

    def lost(self, partitions: list[int]) -> None:
        self.events.emit("lost", p=partitions)
        with self.lock:
            for p in partitions:
                self.processed.pop(p, None)
                self.parked.pop(p, None)


def run_confluent(w: Worker) -> None:
    import confluent_kafka as ck
    a = w.args
    conf = {"bootstrap.servers": a.bootstrap, "group.id": a.group, "client.id": a.name,
            "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "partition.assignment.strategy": a.strategy or "range",
            "topic.metadata.refresh.interval.ms": 2000}
    if a.group_protocol == "consumer":
        # KIP-848: the broker owns the session, the heartbeat interval and the assignor.
        for key in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
            del conf[key]
        conf["group.protocol"] = "consumer"
        if a.strategy:
            conf["group.remote.assignor"] = a.strategy
    if a.instance_id:
        conf["group.instance.id"] = a.instance_id
    c = ck.Consumer(conf)

    def commit() -> None:
        w.commit(lambda offsets: c.commit(offsets=[ck.TopicPartition(a.topic, p, o) for p, o in offsets.items()],
                                          asynchronous=False), ck.KafkaException)

    def on_assign(consumer, partitions) -> None:
        w.assigned(sorted(tp.partition for tp in partitions))

    def on_revoke(consumer, partitions) -> None:
        commit()
        w.revoked(sorted(tp.partition for tp in partitions))

    def on_lost(consumer, partitions) -> None:
        w.lost(sorted(tp.partition for tp in partitions))

    c.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    w.events.emit("started")
    while not w.stop:
        msgs = c.consume(500, 0.1)
        w.on_records([(m.partition(), m.offset()) for m in msgs if m.error() is None])
        if w.due():
            commit()
    w.events.emit("stopping")
    commit()
    c.close()
    w.events.emit("closed")


def run_kafka_python(w: Worker) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata, TopicPartition
    from kafka.errors import KafkaError
    a = w.args
    c = KafkaConsumer(bootstrap_servers=a.bootstrap, group_id=a.group, client_id=a.name,
                      group_instance_id=a.instance_id, session_timeout_ms=SESSION_TIMEOUT_MS,
                      heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS, enable_auto_commit=False,
                      auto_offset_reset="earliest", metadata_max_age_ms=2000)

    def commit() -> None:
        w.commit(lambda offsets: c.commit({TopicPartition(a.topic, p): OffsetAndMetadata(o, "", -1)
                                           for p, o in offsets.items()}), KafkaError)

    class Listener(ConsumerRebalanceListener):
        # kafka-python 3 runs listeners on its IO thread, where a blocking commit is refused: what
        # was processed since the last periodic commit is processed again by the next owner, or
        # committed by this member if the partition comes back to it (Worker.parked).
        def on_partitions_revoked(self, revoked):
            w.revoked(sorted(tp.partition for tp in revoked))

        def on_partitions_assigned(self, assigned):
            w.assigned(sorted(tp.partition for tp in assigned))

        def on_partitions_lost(self, lost):
            w.lost(sorted(tp.partition for tp in lost))

    # kafka-python 3.0.12 loses a join whose poll() times out before the SyncGroup answer when the
    # rejoin was started by a metadata change (docs/compat-notes.md): the topic's metadata is loaded before
    # subscribing, so the first assignment already has every partition, and poll() waits long enough
    # for a whole join.
    c.partitions_for_topic(a.topic)
    c.subscribe([a.topic], listener=Listener())
    w.events.emit("started")
    while not w.stop:
        batches = c.poll(timeout_ms=1000, max_records=500)
        w.on_records([(m.partition, m.offset) for msgs in batches.values() for m in msgs])
        if w.due():
            commit()
    w.events.emit("stopping")
    commit()
    c.close()
    w.events.emit("closed")


def run_aiokafka(w: Worker) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
    from aiokafka.errors import KafkaError
    a = w.args

    async def main() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=a.bootstrap, group_id=a.group, client_id=a.name,
                             group_instance_id=a.instance_id, session_timeout_ms=SESSION_TIMEOUT_MS,
                             heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS, enable_auto_commit=False,
                             auto_offset_reset="earliest", metadata_max_age_ms=2000)

        async def commit() -> None:
            await w.commit_async(lambda offsets: c.commit({TopicPartition(a.topic, p): o for p, o in offsets.items()}),
                                 KafkaError)

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked):
                await commit()
                w.revoked(sorted(tp.partition for tp in revoked))

            async def on_partitions_assigned(self, assigned):
                w.assigned(sorted(tp.partition for tp in assigned))

        c.subscribe([a.topic], listener=Listener())
        await c.start()
        w.events.emit("started")
        while not w.stop:
            batches = await c.getmany(timeout_ms=100, max_records=500)
            w.on_records([(m.partition, m.offset) for msgs in batches.values() for m in msgs])
            if w.due():
                await commit()
        w.events.emit("stopping")
        await commit()
        await c.stop()
        w.events.emit("closed")

    asyncio.run(main())


def main() -> None:
    p = argparse.ArgumentParser()
    for flag in ("--client", "--bootstrap", "--topic", "--group", "--name", "--events"):
        p.add_argument(flag, required=True)
    p.add_argument("--instance-id")
    p.add_argument("--strategy")
    p.add_argument("--group-protocol")
    args = p.parse_args()
    # The client's own log goes to the member's stderr file, and SIGUSR1 dumps every thread's stack
    # there: what a test that times out shows about a member that stopped making progress.
    import faulthandler
    import logging
    logging.basicConfig(level=os.environ.get("GROUP_WORKER_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    w = Worker(args)
    {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}[args.client](w)


# ------------------------------------------------------------------------------------------ test side
class Member:
    """A worker process and what its event file says."""

    def __init__(self, client: str, bootstrap: str, topic: str, group: str, name: str, events_dir: Path,
                 instance_id: str | None = None, strategy: str | None = None, run: int = 1,
                 group_protocol: str | None = None) -> None:
        self.name = name                      # also its client.id
        self.label = f"{name}-{run}"
        self.events_path = events_dir / f"{name}-{run}.jsonl"
        cmd = [sys.executable, __file__, "--client", client, "--bootstrap", bootstrap, "--topic", topic,
               "--group", group, "--name", name, "--events", str(self.events_path)]
        if instance_id:
            cmd += ["--instance-id", instance_id]
        if strategy:
            cmd += ["--strategy", strategy]
        if group_protocol:
            cmd += ["--group-protocol", group_protocol]
        self.stderr_path = events_dir / f"{name}-{run}.stderr"
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err)

    def events(self) -> list[dict]:
        if not self.events_path.exists():
            return []
        out = []
        for line in self.events_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass   # a line cut by kill -9
        return out

    def owned(self) -> set[int]:
        owned: set[int] = set()
        for ev in self.events():
            if ev["e"] == "assigned":
                owned |= set(ev["p"])
            elif ev["e"] in ("revoked", "lost"):
                owned -= set(ev["p"])
            elif ev["e"] == "stopping":
                owned = set()
        return owned

    def close(self, timeout: float = 30) -> None:
        """SIGTERM: the consumer commits, closes and leaves."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout)
        assert self.proc.returncode == 0, f"{self.name} exited {self.proc.returncode}: {self.stderr()}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stderr(self, lines: int = 40) -> str:
        if not self.stderr_path.exists():
            return ""
        return "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])

    def last_processed(self) -> dict[int, int]:
        last: dict[int, int] = {}
        for ev in self.events():
            if ev["e"] == "r":
                last[ev["p"]] = ev["o"]
        return dict(sorted(last.items()))

    def dump_stacks(self) -> None:
        """Ask a live member to write every thread's stack to its stderr file."""
        if self.alive:
            self.proc.send_signal(signal.SIGUSR1)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def ownership_intervals(members: list[Member]) -> dict[int, list[tuple[float, float, str]]]:
    """partition -> [(from, until, member)] from the members' callbacks (until: now if still owned)."""
    out: dict[int, list] = defaultdict(list)
    now = time.time()
    for m in members:
        since: dict[int, float] = {}
        for ev in m.events():
            if ev["e"] == "assigned":
                for p in ev["p"]:
                    since[p] = ev["ts"]
            elif ev["e"] in ("revoked", "lost", "stopping"):
                for p in ev.get("p", list(since)):
                    if p in since:
                        out[p].append((since.pop(p), ev["ts"], m.label))
        for p, t in since.items():
            out[p].append((t, now, m.label))
    return out


def assert_no_two_owners(members: list[Member], killed: dict[str, float]) -> None:
    """No partition was ever owned by two live consumers at once (a killed consumer, by label, owns
    nothing after its kill)."""
    for p, spans in ownership_intervals(members).items():
        spans = sorted((start, min(end, killed.get(name, end)), name) for start, end, name in spans)
        for (s1, e1, n1), (s2, e2, n2) in zip(spans, spans[1:]):
            assert s2 >= e1 or n1 == n2, f"partition {p} owned by {n1} until {e1} and by {n2} from {s2}"


class ProducerThread:
    """Produces to every partition in turn until stopped; keeps the acknowledged offsets."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate_per_s: int = 300) -> None:
        import confluent_kafka as ck
        self.producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic, self.partitions, self.rate = topic, partitions, rate_per_s
        self.acked: dict[int, set[int]] = defaultdict(set)
        self.errors: list = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _ack(self, err, msg) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.acked[msg.partition()].add(msg.offset())

    def abandon(self) -> None:
        """Stop without waiting for outstanding records (cleanup after a failure)."""
        self._flush_s = 1
        self._stop.set()

    def _run(self) -> None:
        i = 0
        self._flush_s = 30
        while not self._stop.is_set():
            self.producer.produce(self.topic, value=b"%d" % i, partition=i % self.partitions, on_delivery=self._ack)
            i += 1
            self.producer.poll(0)
            time.sleep(1 / self.rate)
        self.producer.flush(self._flush_s)

    def stop(self) -> dict[int, set[int]]:
        self._stop.set()
        self.thread.join(60)
        assert not self.errors, self.errors[:5]
        return self.acked


def processed(members: list[Member]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = defaultdict(set)
    for m in members:
        for ev in m.events():
            if ev["e"] == "r":
                out[ev["p"]].add(ev["o"])
    return out


def assert_nothing_skipped(acked: dict[int, set[int]], members: list[Member]) -> None:
    seen = processed(members)
    for p, offsets in acked.items():
        missing = sorted(offsets - seen[p])
        assert not missing, f"partition {p}: {len(missing)} acknowledged records never processed, e.g. {missing[:10]}"


# Answers a client retries (Kafka's AdminClient does; librdkafka 2.16's describe_consumer_groups hands
# them to the caller): the coordinator is still loading its __consumer_offsets partition, or moved.
RETRIABLE_DESCRIBE = {"COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR"}


def describe_group(admin, group: str, timeout: float = 30.0):
    """The group's full description (confluent-kafka's ConsumerGroupDescription), asked again while
    the coordinator answers one of RETRIABLE_DESCRIBE."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout
    while True:
        try:
            return admin.describe_consumer_groups([group], request_timeout=10)[group].result()
        except KafkaException as e:
            if not (e.args and e.args[0].name() in RETRIABLE_DESCRIBE) or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def describe(admin, group: str) -> tuple[str, dict[str, list[int]]]:
    """The group's state and each member's assignment (by client id), as the broker describes it;
    ("LOADING", {}) while the coordinator answers one of RETRIABLE_DESCRIBE."""
    from confluent_kafka import KafkaException

    try:
        d = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    except KafkaException as e:
        if e.args and e.args[0].name() in RETRIABLE_DESCRIBE:
            return "LOADING", {}
        raise
    return d.state.name, {m.client_id: sorted(tp.partition for tp in m.assignment.topic_partitions)
                          for m in d.members}


def wait_stable(admin, group: str, members: list[Member], partitions: int, timeout: float) -> float:
    """Wait until the broker says Stable with exactly `members`, each member's own view (from its
    callbacks) matches the broker's assignment, and every partition has exactly one owner; the time
    it was seen. Whenever the group is Stable and the views agree, no partition may have two owners."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        for m in members:
            assert m.alive, f"{m.name} died: {m.stderr()}"
        state, view = describe(admin, group)
        mine = {m.name: sorted(m.owned()) for m in members}
        last = (state, view, mine)
        if state == "STABLE" and view == mine:
            owned = [p for ps in view.values() for p in ps]
            assert len(owned) == len(set(owned)), f"a partition has two owners: {view}"
            if sorted(owned) == list(range(partitions)):
                return time.time()
        if time.monotonic() > deadline:
            for m in members:
                m.dump_stacks()
            time.sleep(0.5)
            tails = "".join(f"\n--- {m.label} stderr (last 60 lines) ---\n{m.stderr(60)}" for m in members)
            raise AssertionError(f"group {group} not stable with {[m.name for m in members]} after "
                                 f"{timeout}s: broker {last[0]} {last[1]}, members {last[2]}{tails}")
        time.sleep(0.1)


def wait_caught_up(admin, group: str, topic: str, acked: dict[int, set[int]], timeout: float,
                   members: list[Member] = ()) -> None:
    """Until the group's committed offsets reach the end of what was acknowledged."""
    import confluent_kafka as ck
    want = {p: max(offsets) + 1 for p, offsets in acked.items() if offsets}
    deadline = time.monotonic() + timeout
    while True:
        req = ck.ConsumerGroupTopicPartitions(group, [ck.TopicPartition(topic, p) for p in want])
        got = {tp.partition: tp.offset for tp in admin.list_consumer_group_offsets([req])[group].result().topic_partitions}
        if all(got.get(p, -1) >= o for p, o in want.items()):
            return
        if time.monotonic() > deadline:
            for m in members:
                m.dump_stacks()
            time.sleep(0.5)
            seen = "".join(f"\n--- {m.label}: last record processed per partition {m.last_processed()}, "
                           f"owns {sorted(m.owned())}; stderr (last 60 lines) ---\n{m.stderr(60)}" for m in members)
            raise AssertionError(f"committed offsets {got} did not reach {want}{seen}")
        time.sleep(0.2)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        f.result(30)


def two_member_churn(client: str, bootstrap: str, events_dir: Path, partitions: int = 6) -> dict:
    """Members a and b join; a leaves cleanly; c joins; c is killed with kill -9. At every stable point
    each partition has one owner; nothing acknowledged goes unprocessed. Returns the rebalance times."""
    from confluent_kafka.admin import AdminClient
    topic, group = f"{client}-topic", f"{client}-group"
    create_topic(bootstrap, topic, partitions)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    producer = ProducerThread(bootstrap, topic, partitions, rate_per_s=200)
    everyone: list[Member] = []
    killed: dict[str, float] = {}

    def start(name: str) -> Member:
        m = Member(client, bootstrap, topic, group, name, events_dir)
        everyone.append(m)
        return m

    try:
        a = start("a")
        wait_stable(admin, group, [a], partitions, 30)
        b = start("b")
        wait_stable(admin, group, [a, b], partitions, 30)
        t0 = time.time()
        a.close()
        leave_s = wait_stable(admin, group, [b], partitions, 20) - t0
        c = start("c")
        wait_stable(admin, group, [b, c], partitions, 30)
        t0 = time.time()
        c.kill()
        killed[c.label] = t0
        kill_s = wait_stable(admin, group, [b], partitions, SESSION_TIMEOUT_MS / 1000 + 15) - t0
        assert kill_s <= SESSION_TIMEOUT_MS / 1000 + 5, f"c's partitions took {kill_s:.1f}s to move"
        acked = producer.stop()
        wait_caught_up(admin, group, topic, acked, 30, [b])
        b.close()
        assert_no_two_owners(everyone, killed)
        assert_nothing_skipped(acked, everyone)
        print(f"{client}: rebalance after clean leave {leave_s:.2f}s, after kill -9 {kill_s:.2f}s; "
              f"{sum(len(v) for v in acked.values())} records")
        return {"leave_s": leave_s, "kill_s": kill_s}
    finally:
        producer.abandon()
        for m in everyone:
            if m.alive:
                m.kill()


if __name__ == "__main__":
    main()
