"""The coordinator runtime over an in-memory partition log: loading (COORDINATOR_LOAD_IN_PROGRESS until
done), NOT_COORDINATOR, parked requests, timers on a fake clock, and append failures. Each test runs a
bare asyncio loop for a few milliseconds; no sockets, no broker."""

import asyncio

import pytest

from odradek.coordinator import membership as mem
from odradek.coordinator import offsets as offs
from odradek.coordinator.membership import Caller
from odradek.coordinator.records import OffsetAndMetadata, OffsetRecord, build_batch, partition_for
from odradek.coordinator.runtime import CoordinatorError, GroupCoordinator
from odradek.coordinator.shard import GroupConfig
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages.heartbeat import HeartbeatRequest
from odradek.protocol.messages.join_group import JoinGroupRequest, JoinGroupRequestProtocol
from odradek.protocol.messages.offset_commit import (
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
)
from odradek.protocol.messages.sync_group import SyncGroupRequest, SyncGroupRequestAssignment
from odradek.records.header import iter_headers, set_base_offset
from tests.unit.coordinator.harness import subscription

PARTITIONS = 4
CALLER = Caller("client", "/127.0.0.1", 3)


class MemoryLog:
    def __init__(self) -> None:
        self.batches: list[bytearray] = []
        self.end = 0
        self.fail = False

    @property
    def log_start_offset(self) -> int:
        return 0

    @property
    def high_watermark(self) -> int:
        return self.end

    @property
    def log_end_offset(self) -> int:
        return self.end

    def append(self, batch: bytes, now_ms: int) -> int:
        if self.fail:
            raise OSError("disk on fire")
        buf = bytearray(batch)
        set_base_offset(buf, 0, self.end)
        self.end += next(iter_headers(buf)).records_count
        self.batches.append(buf)
        return self.end

    def read(self, start_offset: int, max_bytes: int) -> bytes:
        out = b""
        for b in self.batches:
            if next(iter_headers(b)).base_offset >= start_offset and (not out or len(out) + len(b) <= max_bytes):
                out += bytes(b)
        return out


class Clock:
    def __init__(self) -> None:
        self.now = 5_000_000

    def __call__(self) -> int:
        return self.now


def _join(group: str, member_id: str = "") -> JoinGroupRequest:
    return JoinGroupRequest(group_id=group, session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id=member_id,
                            protocol_type="consumer",
                            protocols=[JoinGroupRequestProtocol(name="range", metadata=subscription("t"))])


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def _coordinator(clock, **config) -> GroupCoordinator:
    config = {"min_session_timeout_ms": 1000, "initial_rebalance_delay_ms": 0, **config}
    return GroupCoordinator(GroupConfig(**config), clock, new_uuid=iter(f"u{i}" for i in range(99)).__next__)


def test_load_in_progress_then_loaded_state():
    log = MemoryLog()
    group = "loaded"
    p = partition_for(group, PARTITIONS)
    for i in range(50):
        log.append(build_batch([OffsetRecord(group, "t", 0, OffsetAndMetadata(i, -1, "", 1, None))], 1), 1)

    async def main():
        c = _coordinator(Clock(), load_buffer_bytes=200)
        await c.start()
        with pytest.raises(CoordinatorError) as e:
            c.shard_for(group)
        assert e.value.code == ErrorCode.NOT_COORDINATOR
        c.elect(p, log, PARTITIONS)
        with pytest.raises(CoordinatorError) as e:
            c.shard_for(group)
        assert e.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        while c.loading:
            await asyncio.sleep(0)
        found = c.query(group, offs.fetch_offsets, group, [("t", [0])])
        assert found[0][1][0][1].offset == 49
        other = next(f"g{i}" for i in range(100) if partition_for(f"g{i}", PARTITIONS) != p)
        with pytest.raises(CoordinatorError) as e:
            c.shard_for(other)
        assert e.value.code == ErrorCode.NOT_COORDINATOR
        await c.aclose()

    _run(main())


def test_parked_join_completes_and_session_expiry_runs_on_the_clock():
    log, clock = MemoryLog(), Clock()
    group = "timers"

    async def main():
        c = _coordinator(clock)
        await c.start()
        c.elect(partition_for(group, PARTITIONS), log, PARTITIONS)
        while c.loading:
            await asyncio.sleep(0)
        r = await c.execute(group, mem.join_group, _join(group), CALLER)
        assert r.error_code == ErrorCode.NONE and r.generation_id == 1   # the 0 ms initial delay ran as a timer
        me = r.member_id
        assign = [SyncGroupRequestAssignment(member_id=me, assignment=b"a")]
        s = await c.execute(group, mem.sync_group, SyncGroupRequest(group_id=group, generation_id=1, member_id=me,
                                                                   assignments=assign), CALLER)
        assert s.assignment == b"a" and len(log.batches) == 1
        clock.now += 6001
        c._wake.set()
        for _ in range(10):
            await asyncio.sleep(0)
        hb = await c.execute(group, mem.heartbeat, HeartbeatRequest(group_id=group, generation_id=1, member_id=me),
                             CALLER)
        assert hb.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        assert len(log.batches) == 2                       # the group went empty: a record
        await c.aclose()

    _run(main())


def test_a_failed_append_reloads_the_partition_from_its_log():
    log, clock = MemoryLog(), Clock()
    group = "fragile"
    p = partition_for(group, PARTITIONS)

    async def main():
        c = _coordinator(clock)
        await c.start()
        c.elect(p, log, PARTITIONS)
        while c.loading:
            await asyncio.sleep(0)
        commit = offs.commit_offsets

        def request(offset):
            return OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
                OffsetCommitRequestTopic(name="t", partitions=[OffsetCommitRequestPartition(
                    partition_index=0, committed_offset=offset)])])

        ok = lambda name: ErrorCode.NONE  # noqa: E731
        await c.execute(group, commit, request(7), 8, ok)
        log.fail = True
        with pytest.raises(CoordinatorError) as e:
            await c.execute(group, commit, request(8), 8, ok)
        assert e.value.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        log.fail = False
        while c.loading:
            await asyncio.sleep(0)
        assert c.query(group, offs.fetch_offsets, group, None)[0][1][0][1].offset == 7
        await c.aclose()

    _run(main())


def test_resign_sends_parked_members_to_find_the_new_coordinator():
    log, clock = MemoryLog(), Clock()
    group = "moving"
    p = partition_for(group, PARTITIONS)

    async def main():
        c = _coordinator(clock, initial_rebalance_delay_ms=60_000, max_session_timeout_ms=60_000)
        await c.start()
        c.elect(p, log, PARTITIONS)
        while c.loading:
            await asyncio.sleep(0)
        parked = asyncio.ensure_future(c.execute(group, mem.join_group, _join(group), CALLER))
        await asyncio.sleep(0)
        assert not parked.done()
        c.resign(p)
        with pytest.raises(CoordinatorError) as e:
            await parked
        assert e.value.code == ErrorCode.NOT_COORDINATOR
        await c.aclose()

    _run(main())


class ReplicatedLog(MemoryLog):
    """A leader's log whose high watermark moves only when the followers are said to have the records."""

    def __init__(self) -> None:
        super().__init__()
        self.hw = 0

    @property
    def high_watermark(self) -> int:
        return self.hw

    def replicate(self, coordinator: GroupCoordinator, partition: int) -> None:
        self.hw = self.end
        coordinator.high_watermark_advanced(partition, self.hw)


def _commit_request(group: str, offset: int) -> OffsetCommitRequest:
    return OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        OffsetCommitRequestTopic(name="t", partitions=[OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset)])])


def _ok(name):
    return ErrorCode.NONE


def test_a_write_completes_when_the_high_watermark_passes_it():
    log, clock = ReplicatedLog(), Clock()
    group = "replicated"
    p = partition_for(group, PARTITIONS)

    async def main():
        c = _coordinator(clock)
        await c.start()
        c.elect(p, log, PARTITIONS)
        while c.loading:
            await asyncio.sleep(0)
        commit = asyncio.ensure_future(c.execute(group, offs.commit_offsets, _commit_request(group, 7), 8, _ok))
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(log.batches) == 1 and not commit.done()      # appended, not yet committed
        # The state is replayed at once: a later operation sees it, but its answer waits too.
        fetch = asyncio.ensure_future(c.execute(group, offs.delete_offsets, group, [("u", [0])], _ok))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not fetch.done()
        log.replicate(c, p)
        response = await asyncio.wait_for(commit, 1)
        assert response.topics[0].partitions[0].error_code == ErrorCode.NONE
        await asyncio.wait_for(fetch, 1)
        assert c.query(group, offs.fetch_offsets, group, None)[0][1][0][1].offset == 7
        await c.aclose()

    _run(main())


def test_resigning_fails_writes_the_high_watermark_never_reached():
    log, clock = ReplicatedLog(), Clock()
    group = "deposed"
    p = partition_for(group, PARTITIONS)

    async def main():
        c = _coordinator(clock)
        await c.start()
        c.elect(p, log, PARTITIONS)
        while c.loading:
            await asyncio.sleep(0)
        commit = asyncio.ensure_future(c.execute(group, offs.commit_offsets, _commit_request(group, 3), 8, _ok))
        for _ in range(5):
            await asyncio.sleep(0)
        c.resign(p)
        with pytest.raises(CoordinatorError) as e:
            await asyncio.wait_for(commit, 1)
        assert e.value.code == ErrorCode.NOT_COORDINATOR
        await c.aclose()

    _run(main())
