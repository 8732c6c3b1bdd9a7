"""Records: Kafka's byte layouts, the partition of a group, and replay equivalence (a shard rebuilt
from the log, duplicated or compacted, equals the live one wherever the group is Empty or Stable)."""

import random
import struct

from odradek.coordinator.group import GroupState
from odradek.coordinator.records import (
    GroupRecord, OffsetAndMetadata, OffsetRecord, decode, encode, java_string_hash, partition_for,
)
from odradek.coordinator.shard import GroupShard
from odradek.protocol.error_codes import ErrorCode
from tests.unit.coordinator.harness import GROUP, Harness, Pending, assignment

E = ErrorCode


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def test_offset_commit_bytes_are_kafkas():
    key, value = encode(OffsetRecord("grp", "top", 7, OffsetAndMetadata(42, 3, "meta", 1000, None)))
    assert key == struct.pack(">h", 1) + _s("grp") + _s("top") + struct.pack(">i", 7)
    assert value == struct.pack(">hqi", 3, 42, 3) + _s("meta") + struct.pack(">q", 1000)
    _, value = encode(OffsetRecord("grp", "top", 7, OffsetAndMetadata(42, 3, "meta", 1000, 5000)))
    assert value == struct.pack(">hq", 1, 42) + _s("meta") + struct.pack(">qq", 1000, 5000)
    assert decode(key, None) == OffsetRecord("grp", "top", 7, None)
    assert decode(key, value).value == OffsetAndMetadata(42, -1, "meta", 1000, 5000)


def test_group_metadata_bytes_are_kafkas():
    h = Harness()
    (a,) = h.stable_group(1)
    record = h.records()[-1]
    key, value = encode(record)
    assert key == struct.pack(">h", 2) + _s(GROUP)
    m = h.group.members[a]
    expected = (struct.pack(">h", 3) + _s("consumer") + struct.pack(">i", 1) + _s("range") + _s(a)
                + struct.pack(">q", h.group.state_timestamp_ms) + struct.pack(">i", 1)
                + _s(a) + struct.pack(">h", -1) + _s("client") + _s("/127.0.0.1")
                + struct.pack(">ii", 30_000, 10_000)
                + struct.pack(">i", len(m.metadata("range"))) + m.metadata("range")
                + struct.pack(">i", len(m.assignment)) + m.assignment)
    assert value == expected
    assert decode(key, None) == GroupRecord(GROUP, None)
    assert decode(struct.pack(">h", 10) + b"whatever", b"x") is None   # share group records: not read


def test_partition_is_javas_string_hash_mod_partitions():
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("é") == 233
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00          # UTF-16 surrogate pair
    assert java_string_hash("polygenelubricants") == -(1 << 31)            # Utils.abs(MIN_VALUE) is 0
    assert partition_for("polygenelubricants", 50) == 0
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    negative = next(f"group-{i}" for i in range(1000) if java_string_hash(f"group-{i}") < 0)
    assert partition_for(negative, 50) == abs(java_string_hash(negative)) % 50


def _compacted(records, drop_tombstones: bool):
    last = {}
    for i, r in enumerate(records):
        last[encode(r)[0]] = (i, r)
    kept = sorted(last.values(), key=lambda x: x[0])
    return [r for _, r in kept if not (drop_tombstones and r.value is None)]


def _check_equivalence(h: Harness) -> None:
    live = h.shard.durable_view()
    records = h.records()
    for variant in (records, records + records, _compacted(records, False), _compacted(records, True)):
        fresh = GroupShard(0, h.shard.config)
        for r in variant:
            fresh.replay(r, h.now)
        assert fresh.durable_view() == live


def test_replay_rebuilds_the_live_state_at_every_stable_point():
    h = Harness()
    a, b = h.stable_group(2)
    h.commit({("t", 0): 5, ("t", 1): 6}, member_id=a, generation=1)
    _check_equivalence(h)
    p = h.join(instance="s1")
    h.join(a), h.join(b)
    s1 = h.result(p).member_id
    plan = {a: assignment(t=[0]), b: assignment(t=[1]), s1: assignment(t=[2])}
    h.sync(b, 2), h.sync(s1, 2, instance="s1")
    h.sync(a, 2, plan)
    _check_equivalence(h)
    h.join(instance="s1")                                    # static restart: a record, no rebalance
    _check_equivalence(h)
    h.commit({("u", 0): 1}, group="simple")                 # an offsets-only group
    _check_equivalence(h)
    h.advance(20_000)                                        # everyone silent: all expire
    assert h.group.state == GroupState.EMPTY
    _check_equivalence(h)


class _Client:
    def __init__(self, name: str, instance: str | None) -> None:
        self.name, self.instance = name, instance
        self.member_id, self.generation = "", -1
        self.join = self.sync = None
        self.alive = True


def _drive(h: Harness, rng: random.Random, steps: int) -> None:
    """Clients that behave like consumers (join, sync, heartbeat, commit, rejoin when told), some of
    which crash, leave or restart; time moves on in random steps."""
    clients = [_Client(f"c{i}", f"i{i}" if i % 3 == 0 else None) for i in range(5)]
    checked = 0
    for _ in range(steps):
        c = rng.choice(clients)
        roll = rng.random()
        if not c.alive:
            if roll < 0.2:                                    # restarts with a fresh process
                c.alive, c.member_id, c.generation, c.join, c.sync = True, "", -1, None, None
        elif roll < 0.03:
            c.alive = False                                   # crash: goes silent
        elif roll < 0.05 and c.member_id:
            h.leave((c.member_id, c.instance))
            c.member_id, c.generation, c.join, c.sync = "", -1, None, None
        elif c.join is None and c.sync is None and c.generation < 0:
            r = h.join(c.member_id, instance=c.instance, session_ms=4000, rebalance_ms=6000)
            if isinstance(r, Pending):
                c.join = r
            elif r.error_code == E.MEMBER_ID_REQUIRED:
                c.member_id = r.member_id
            elif r.error_code == E.NONE:
                c.member_id, c.generation = r.member_id, r.generation_id
                c.sync = h.sync(c.member_id, c.generation, instance=c.instance)
            else:
                c.member_id = ""
        elif c.join is not None:
            r = h.result(c.join)
            if r is not None:
                c.join = None
                if r.error_code == E.NONE:
                    c.member_id, c.generation = r.member_id, r.generation_id
                    plan = {m.member_id: assignment(t=[i]) for i, m in enumerate(r.members)}
                    c.sync = h.sync(c.member_id, c.generation, plan, instance=c.instance)
                else:
                    c.member_id, c.generation = "", -1
        elif c.sync is not None:
            r = h.result(c.sync)
            if r is not None:
                c.sync = None
                if r.error_code != E.NONE:
                    c.generation = -1
                    if r.error_code in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
                        c.member_id = ""
        else:
            if roll < 0.3:
                h.commit({("t", rng.randrange(3)): rng.randrange(100)}, member_id=c.member_id,
                         generation=c.generation, instance=c.instance)
            code = h.heartbeat(c.member_id, c.generation, instance=c.instance)
            if code != E.NONE:
                c.generation = -1
                if code in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.ILLEGAL_GENERATION):
                    c.member_id = "" if code != E.ILLEGAL_GENERATION else c.member_id
        h.advance(rng.choice((0, 10, 100, 500, 1000, 2500)))
        g = h.group
        if g is None or g.state in (GroupState.EMPTY, GroupState.STABLE):
            _check_equivalence(h)
            checked += 1
    assert checked > 0


def test_replay_equivalence_under_random_membership_churn():
    for seed in range(6):
        h = Harness()
        _drive(h, random.Random(seed), 300)
