"""odradek's own consumer in consumer groups, against a real broker: our consumers as processes on a
six-partition topic while a producer runs (join, clean leave, kill -9, restart: one owner per partition
at every stable point, nothing acknowledged left unprocessed); mixed groups with librdkafka
(confluent-kafka) members whose assignment must equal Java's RangeAssignor/RoundRobinAssignor whoever
leads; cooperative-sticky moving only what must move; and in-process checks of commit, committed,
commit_async, auto commit, pattern subscription, static membership and max.poll.interval.ms.

Run as a script (`--client odradek ...`, the flags of groups_support.py) this file is the worker
process of one of our consumers, writing groups_support's event file.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

from odradek.client import Consumer, KafkaError, TopicPartition


def run_odradek(w) -> None:
    """groups_support's worker loop on the asyncio consumer: commit every 200 ms and on revocation."""
    from groups_support import HEARTBEAT_INTERVAL_MS, SESSION_TIMEOUT_MS
    a = w.args

    async def main() -> None:
        conf = {"bootstrap.servers": a.bootstrap, "group.id": a.group, "client.id": a.name,
                "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                "enable.auto.commit": False, "auto.offset.reset": "earliest",
                "partition.assignment.strategy": a.strategy or "range", "metadata.max.age.ms": 2000}
        if a.instance_id:
            conf["group.instance.id"] = a.instance_id
        if getattr(a, "group_protocol", None) == "consumer":
            conf["group.protocol"] = "consumer"     # KIP-848: the broker keeps the session and assigns
        c = Consumer(conf)
        await c.start()

        async def commit() -> None:
            await w.commit_async(lambda offsets: c.commit({TopicPartition(a.topic, p): o for p, o in offsets.items()}),
                                 KafkaError)

        class Listener:
            async def on_partitions_revoked(self, revoked):
                await commit()
                w.revoked(sorted(tp.partition for tp in revoked))

            def on_partitions_assigned(self, assigned):
                m = c._membership
                w.assigned(sorted(tp.partition for tp in assigned), member=m.member_id, leader=m.leader_id,
                           generation=m.generation)

            def on_partitions_lost(self, lost):
                w.lost(sorted(tp.partition for tp in lost))

        c.subscribe([a.topic], listener=Listener())
        w.events.emit("started")
        while not w.stop:
            batches = await c.getmany(timeout_ms=100, max_records=500)
            w.on_records([(r.partition, r.offset) for rs in batches.values() for r in rs])
            if w.due():
                await commit()
        w.events.emit("stopping")
        await commit()
        await c.aclose()
        w.events.emit("closed")

    asyncio.run(main())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    import groups_support
    parser = argparse.ArgumentParser()
    for flag in ("--client", "--bootstrap", "--topic", "--group", "--name", "--events"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--instance-id")
    parser.add_argument("--strategy")
    parser.add_argument("--group-protocol")
    run_odradek(groups_support.Worker(parser.parse_args()))
    sys.exit(0)


import confluent_kafka as ck  # noqa: E402
import pytest  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from odradek.client.assignors import RangeAssignor, RoundRobinAssignor, Subscription  # noqa: E402
from odradek.client.group import FencedInstanceIdError  # noqa: E402

from .groups_support import describe_group  # noqa: E402
from .groups_support import (  # noqa: E402
    SESSION_TIMEOUT_MS, Member, ProducerThread, assert_no_two_owners, assert_nothing_skipped, wait_caught_up,
    wait_stable,
)

BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 1000}
PARTITIONS = 6
SESSION_S = SESSION_TIMEOUT_MS / 1000


class OurMember(Member):
    """A worker process running odradek's consumer (this file as a script)."""

    def __init__(self, bootstrap: str, topic: str, group: str, name: str, events_dir: Path,
                 instance_id: str | None = None, strategy: str | None = None, run: int = 1,
                 group_protocol: str | None = None) -> None:
        self.name = name
        self.label = f"{name}-{run}"
        self.events_path = events_dir / f"{name}-{run}.jsonl"
        cmd = [sys.executable, __file__, "--client", "odradek", "--bootstrap", bootstrap, "--topic", topic,
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


class Group:
    """The members started in one test, cleaned up however it ends."""

    def __init__(self, broker, topic: str, group: str, tmp_path: Path, partitions: int = PARTITIONS,
                 produce: bool = True) -> None:
        self.broker, self.topic, self.group, self.dir = broker, topic, group, tmp_path
        self.admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for f in self.admin.create_topics([NewTopic(topic, partitions, 1)]).values():
            f.result(30)
        self.producer = ProducerThread(broker.bootstrap, topic, partitions, rate_per_s=200) if produce else None
        self.everyone: list[Member] = []
        self.killed: dict[str, float] = {}

    def ours(self, name: str, **kw) -> Member:
        m = OurMember(self.broker.bootstrap, self.topic, self.group, name, self.dir, **kw)
        self.everyone.append(m)
        return m

    def theirs(self, name: str, **kw) -> Member:
        m = Member("confluent", self.broker.bootstrap, self.topic, self.group, name, self.dir, **kw)
        self.everyone.append(m)
        return m

    def stable(self, members, timeout: float = 30) -> float:
        return wait_stable(self.admin, self.group, members, PARTITIONS, timeout)

    def finish(self, members) -> None:
        """Stop producing, wait for the group's commits to catch up, close, check the whole history."""
        acked = self.producer.stop()
        wait_caught_up(self.admin, self.group, self.topic, acked, 30)
        for m in members:
            m.close()
        assert_no_two_owners(self.everyone, self.killed)
        assert_nothing_skipped(acked, self.everyone)

    def cleanup(self) -> None:
        if self.producer is not None:
            self.producer.abandon()
        for m in self.everyone:
            if m.alive:
                m.kill()


@pytest.fixture
def groups(broker, tmp_path):
    made: list[Group] = []

    def make(topic: str, group: str, **kw) -> Group:
        g = Group(broker, topic, group, tmp_path, **kw)
        made.append(g)
        return g
    yield make
    for g in made:
        g.cleanup()


def members_of(admin, group: str) -> list[tuple[str, str, list[int]]]:
    """(member id, client id, partitions) of every member, as the broker describes the group."""
    d = describe_group(admin, group)
    return [(m.member_id, m.client_id, sorted(tp.partition for tp in m.assignment.topic_partitions))
            for m in d.members]


def moved_within(members, partitions: set[int], after: float) -> float:
    latest = {}
    for m in members:
        for ev in m.events():
            if ev["e"] == "assigned" and ev["ts"] >= after:
                for p in ev["p"]:
                    if p in partitions:
                        latest[p] = max(latest.get(p, 0), ev["ts"])
    assert set(latest) == partitions, f"partitions {partitions - set(latest)} never moved"
    return max(latest.values()) - after


# ------------------------------------------------------------------------------------------ our consumers
def test_our_consumers_share_leave_kill_and_restart(groups):
    g = groups("orders", "billing")
    a = g.ours("a")
    g.stable([a])
    b = g.ours("b")
    g.stable([a, b])
    c = g.ours("c")
    g.stable([a, b, c])

    t0 = time.time()
    a.close()                                        # LeaveGroup: the others take over at once
    leave_s = g.stable([b, c], 15) - t0
    assert leave_s < SESSION_S, f"a clean leave took {leave_s:.1f}s (a session timeout?)"

    lost = c.owned()
    t0 = time.time()
    c.kill()                                         # kill -9: moves once c's session times out
    g.killed[c.label] = t0
    g.stable([b], SESSION_S + 15)
    kill_s = moved_within([b], lost, t0)
    assert kill_s <= SESSION_S + 5, f"c's partitions took {kill_s:.1f}s to move"

    c2 = g.ours("c", run=2)                          # restart: resumes from the group's commits
    g.stable([b, c2])
    g.finish([b, c2])
    print(f"clean leave {leave_s:.2f}s, kill -9 {kill_s:.2f}s (session {SESSION_S:.0f}s)")


def test_static_member_restart_keeps_its_partitions_without_a_rebalance(groups):
    g = groups("static-orders", "static-billing")
    a, b = g.ours("a", instance_id="static-a"), g.ours("b")
    g.stable([a, b])
    before, b_events = a.owned(), len(b.events())
    t0 = time.time()
    a.close()                                        # a static member sends no LeaveGroup
    a2 = g.ours("a", instance_id="static-a", run=2)
    g.stable([a2, b], SESSION_S)
    assert a2.owned() == before
    assert not [e for e in b.events()[b_events:] if e["e"] in ("assigned", "revoked")], \
        "the static restart made the other member rebalance"
    print(f"static restart {time.time() - t0:.2f}s")
    g.finish([a2, b])


# ------------------------------------------------------------------------------------------ mixed groups
@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
@pytest.mark.parametrize("first", ["ours", "confluent"])
def test_mixed_group_with_librdkafka_agrees_with_java_order(groups, strategy, first):
    """Four members, two of each client; whichever leads, the broker's assignment is the one Java's
    assignor computes from the member ids, and every member's own view matches it."""
    g = groups(f"mixed-{strategy}-{first}", f"mixed-{strategy}-{first}")
    start = {"ours": g.ours, "confluent": g.theirs}
    other = "confluent" if first == "ours" else "ours"
    leader = start[first](f"{first}-1", strategy=strategy)
    g.stable([leader])
    rest = [start[other](f"{other}-1", strategy=strategy), start[first](f"{first}-2", strategy=strategy),
            start[other](f"{other}-2", strategy=strategy)]
    everyone = [leader, *rest]
    g.stable(everyone)

    described = members_of(g.admin, g.group)
    assignor = RangeAssignor() if strategy == "range" else RoundRobinAssignor()
    expected = assignor.assign({g.topic: PARTITIONS}, {mid: Subscription((g.topic,)) for mid, _, _ in described})
    by_client = {client: parts for _, client, parts in described}
    assert by_client == {client: sorted(tp.partition for tp in expected[mid]) for mid, client, _ in described}

    ours = [m for m in everyone if isinstance(m, OurMember)]
    last = [e for e in ours[0].events() if e["e"] == "assigned"][-1]
    leader_id = next(mid for mid, client, _ in described if client == leader.name)
    assert last["leader"] == leader_id, "the first member to join should lead"
    g.finish(everyone)


@pytest.mark.parametrize("first", ["ours", "confluent"])
def test_cooperative_sticky_mixed_with_librdkafka_moves_only_what_must_move(groups, first):
    """a (the leader, so its assignor runs) and b are of different clients; c is ours."""
    g = groups(f"sticky-mixed-{first}", f"sticky-mixed-{first}")
    ours_first = first == "ours"
    a = (g.ours if ours_first else g.theirs)("a", strategy="cooperative-sticky")
    g.stable([a])
    b = (g.theirs if ours_first else g.ours)("b", strategy="cooperative-sticky")
    g.stable([a, b])
    before = {m.name: m.owned() for m in (a, b)}
    assert sorted(len(v) for v in before.values()) == [3, 3]
    seen = {m.name: len(m.events()) for m in (a, b)}
    c = g.ours("c", strategy="cooperative-sticky")
    g.stable([a, b, c])
    after = {m.name: m.owned() for m in (a, b, c)}
    assert sorted(len(v) for v in after.values()) == [2, 2, 2]
    for m in (a, b):
        assert after[m.name] <= before[m.name], f"{m.name} gained a partition"
        revoked = [set(e["p"]) for e in m.events()[seen[m.name]:] if e["e"] == "revoked"]
        assert all(r <= before[m.name] - after[m.name] for r in revoked), f"{m.name} gave up what it kept: {revoked}"
        assert sum(len(r) for r in revoked) == 1
    # a leaves: b and c keep what they have and split a's two
    keep = {m.name: after[m.name] for m in (b, c)}
    a.close()
    g.stable([b, c])
    for m in (b, c):
        assert m.owned() >= keep[m.name]
    g.finish([b, c])


def test_cooperative_sticky_ours_only(groups):
    g = groups("sticky-ours", "sticky-ours")
    a, b = g.ours("a", strategy="cooperative-sticky"), g.ours("b", strategy="cooperative-sticky")
    g.stable([a, b])
    before = {m.name: m.owned() for m in (a, b)}
    seen = {m.name: len(m.events()) for m in (a, b)}
    c = g.ours("c", strategy="cooperative-sticky")
    g.stable([a, b, c])
    for m in (a, b):
        assert m.owned() <= before[m.name] and len(m.owned()) == 2
        assert not [e for e in m.events()[seen[m.name]:] if e["e"] == "lost"]
        revoked = [set(e["p"]) for e in m.events()[seen[m.name]:] if e["e"] == "revoked"]
        assert sum(len(r) for r in revoked) == 1
    g.finish([a, b, c])


# ------------------------------------------------------------------------------------------ in process
def produce(bootstrap: str, topic: str, partitions: int, count: int) -> None:
    p = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    for i in range(count):
        p.produce(topic, value=b"%d" % i, partition=i % partitions)
    assert p.flush(30) == 0


def create(broker, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)


def conf(broker, group: str, **kw) -> dict:
    return {"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 300, **{k.replace("_", "."): v for k, v in kw.items()}}


async def drain(c: Consumer, want: int, timeout_s: float = 20) -> list:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += await c.poll(timeout_ms=200)
    return got


def test_commit_committed_async_commit_and_resume(broker):
    create(broker, "ledger", 2)
    produce(broker.bootstrap, "ledger", 2, 40)
    tps = [TopicPartition("ledger", 0), TopicPartition("ledger", 1)]

    async def main():
        async with Consumer(conf(broker, "accounts", enable_auto_commit=False)) as c:
            c.subscribe(["ledger"])
            got = await drain(c, 40)
            assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in (0, 1) for o in range(20)]
            assert await c.committed(tps) == {tps[0]: None, tps[1]: None}
            await c.commit({tps[0]: 5})
            assert (await c.committed(tps))[tps[0]] == 5
            done = asyncio.get_running_loop().create_future()
            c.commit_async({tps[1]: 7}, lambda offsets, err: done.set_result((offsets, err)))
            offsets, err = await asyncio.wait_for(done, 10)
            assert err is None and offsets == {tps[1]: 7}
            assert await c.committed(tps) == {tps[0]: 5, tps[1]: 7}
        async with Consumer(conf(broker, "accounts", enable_auto_commit=False)) as c:
            c.subscribe(["ledger"])
            got = await drain(c, 15 + 13)
            assert sorted((r.partition, r.offset) for r in got) == \
                [(0, o) for o in range(5, 20)] + [(1, o) for o in range(7, 20)]
            await c.commit()                      # every position
            assert await c.committed(tps) == {tps[0]: 20, tps[1]: 20}
    asyncio.run(main())


def test_auto_commit_on_interval_and_close(broker):
    create(broker, "auto", 3)
    produce(broker.bootstrap, "auto", 3, 30)
    tps = [TopicPartition("auto", p) for p in range(3)]

    async def main():
        async with Consumer(conf(broker, "auto-group", auto_commit_interval_ms=200)) as c:
            c.subscribe(["auto"])
            assert len(await drain(c, 30)) == 30
            deadline = time.monotonic() + 10
            while await c.committed(tps) != {tp: 10 for tp in tps}:
                assert time.monotonic() < deadline, "auto commit did not happen"
                await c.poll(timeout_ms=100)
        produce(broker.bootstrap, "auto", 3, 3)
        async with Consumer(conf(broker, "auto-group")) as c:
            c.subscribe(["auto"])
            got = await drain(c, 3)
            assert sorted((r.partition, r.offset) for r in got) == [(0, 10), (1, 10), (2, 10)]
        async with Consumer(conf(broker, "auto-group", enable_auto_commit=False)) as c:
            assert await c.committed(tps) == {tp: 11 for tp in tps}   # committed on close
    asyncio.run(main())


def test_pattern_subscription_follows_new_topics(broker):
    create(broker, "pat-one", 2)

    class Listener:
        def __init__(self):
            self.assigned = set()

        def on_partitions_assigned(self, tps):
            self.assigned |= tps

        def on_partitions_revoked(self, tps):
            self.assigned -= tps

    async def main():
        listener = Listener()
        async with Consumer(conf(broker, "pattern-group", metadata_max_age_ms=500)) as c:
            c.subscribe(pattern=r"pat-.*", listener=listener)
            deadline = time.monotonic() + 15
            while listener.assigned != {TopicPartition("pat-one", 0), TopicPartition("pat-one", 1)}:
                assert time.monotonic() < deadline, listener.assigned
                await c.poll(timeout_ms=100)
            create(broker, "pat-two", 1)
            create(broker, "other", 1)
            while TopicPartition("pat-two", 0) not in listener.assigned:
                assert time.monotonic() < deadline, listener.assigned
                await c.poll(timeout_ms=100)
            assert c.subscription() == {"pat-one", "pat-two"}
            assert c.assignment() == listener.assigned
    asyncio.run(main())


def test_max_poll_interval_leaves_and_the_next_poll_rejoins(broker):
    create(broker, "slow", 2)
    lost: list = []

    class Listener:
        def on_partitions_lost(self, tps):
            lost.append(tps)

    async def main():
        cfg = conf(broker, "slow-group", max_poll_interval_ms=1500)
        async with Consumer(cfg) as slow, Consumer(cfg) as fast:
            slow.subscribe(["slow"], listener=Listener())
            fast.subscribe(["slow"])
            deadline = time.monotonic() + 20
            while len(slow.assignment()) + len(fast.assignment()) != 2 or not slow.assignment():
                assert time.monotonic() < deadline
                await asyncio.gather(slow.poll(timeout_ms=100), fast.poll(timeout_ms=100))
            await asyncio.sleep(2.5)                  # slow stops polling: it leaves the group
            while len(fast.assignment()) != 2:
                assert time.monotonic() < deadline, fast.assignment()
                await fast.poll(timeout_ms=100)
            while len(slow.assignment()) != 1 or len(fast.assignment()) != 1:   # and comes back
                assert time.monotonic() < deadline
                await asyncio.gather(slow.poll(timeout_ms=100), fast.poll(timeout_ms=100))
            assert len(lost) == 1 and len(lost[0]) == 1
    asyncio.run(main())


def test_second_consumer_with_the_same_instance_id_fences_the_first(broker):
    create(broker, "fence", 1)

    async def main():
        cfg = conf(broker, "fence-group", group_instance_id="only-one")
        async with Consumer(cfg) as first:
            first.subscribe(["fence"])
            deadline = time.monotonic() + 15
            while not first.assignment():
                assert time.monotonic() < deadline
                await first.poll(timeout_ms=100)
            async with Consumer(cfg) as second:
                second.subscribe(["fence"])
                while not second.assignment():       # takes the first one's place, no rebalance
                    assert time.monotonic() < deadline
                    await second.poll(timeout_ms=100)
                assert second.assignment() == {TopicPartition("fence", 0)}
                with pytest.raises(FencedInstanceIdError):
                    while time.monotonic() < deadline:
                        await first.poll(timeout_ms=100)
    asyncio.run(main())


def test_sync_facade_subscribe_and_commit(broker):
    from odradek.client.sync import Consumer as SyncConsumer
    create(broker, "facade", 1)
    produce(broker.bootstrap, "facade", 1, 5)
    with SyncConsumer(conf(broker, "facade-group", enable_auto_commit=False)) as c:
        c.subscribe(["facade"])
        got = []
        deadline = time.monotonic() + 15
        while len(got) < 5 and time.monotonic() < deadline:
            got += c.poll(timeout_ms=200)
        assert [r.offset for r in got] == list(range(5))
        c.commit()
        assert c.committed([("facade", 0)]) == {TopicPartition("facade", 0): 5}
