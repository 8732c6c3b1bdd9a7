"""Replica fetcher (server/replica_fetcher.py): how long a follower holds a partition back after its
leader refused a fetch. The leader here is a fake that answers Fetch requests as a broker does, so the
order of answers is the test's own."""

from __future__ import annotations

import asyncio

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import fetch as fm
from odradek.records.builder import RecordBatchBuilder
from odradek.server.replica_fetcher import FIRST_HOLD_MS, FetcherConfig, FetchState, ReplicaFetcher
from tests.unit.server.fakes import until

KEY = ("t", 0)


class Follower:
    """The replica manager as a fetcher sees it: one empty partition with no leader epoch yet."""

    def __init__(self) -> None:
        self.log_end = 0
        self.appended: list[bytes] = []

    def follower_log_end_offset(self, topic: str, index: int) -> int | None:
        return self.log_end

    def follower_truncation_point(self, topic: str, index: int, leader_epoch: int,
                                  leader_end_offset: int) -> int | None:
        return None

    def follower_latest_epoch(self, topic: str, index: int) -> int | None:
        return None

    def truncate_follower(self, topic: str, index: int, offset: int, *, fully: bool, now_ms: int) -> None:
        raise AssertionError("nothing to truncate")

    def append_to_follower(self, topic: str, index: int, records: bytes | memoryview, leader_high_watermark: int,
                           now_ms: int) -> object:
        self.appended.append(bytes(records))
        self.log_end += 1
        return None

    def update_follower_from_leader(self, topic: str, index: int, leader_high_watermark: int) -> None:
        pass


async def _answered(response: object) -> object:
    """`response`, arriving as a real one does: after the request's task has given the loop a turn."""
    answer = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(answer.set_result, response)
    return await answer


def _one_record() -> bytes:
    builder = RecordBatchBuilder()
    builder.append(None, b"v", timestamp=1)
    return bytes(builder.build())


class Leader:
    """Answers NOT_LEADER_OR_FOLLOWER to the first `refusals` fetches, then one record per fetch; notes
    when each fetch came (loop time)."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.fetched_at: list[float] = []
        self.record = _one_record()

    async def request(self, purpose: str, broker_id: int, api_key: int, body: object, *,
                      timeout_ms: int | None = None) -> object:
        assert isinstance(body, fm.FetchRequest) and body.replica_id == 2
        self.fetched_at.append(asyncio.get_running_loop().time())
        if len(self.fetched_at) <= self.refusals:
            part = fm.PartitionData(partition_index=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER.value)
        else:
            part = fm.PartitionData(partition_index=0, high_watermark=1, records=self.record)
        return await _answered(fm.FetchResponse(responses=[fm.FetchableTopicResponse(topic="t", partitions=[part])]))

    def drop(self, purpose: str, broker_id: int) -> None:
        raise AssertionError("no fetch to give up")


class ParkingLeader:
    """A leader with nothing new for partition 0: a fetch that asks only for it stays parked until the
    follower gives it up; a fetch that asks for partition 1 too gets a record for partition 1 at once."""

    def __init__(self) -> None:
        self.asked: list[list[tuple[str, int]]] = []
        self.drops: list[str] = []
        self.record = _one_record()

    async def request(self, purpose: str, broker_id: int, api_key: int, body: object, *,
                      timeout_ms: int | None = None) -> object:
        assert isinstance(body, fm.FetchRequest)
        keys = [(t.topic, p.partition) for t in body.topics for p in t.partitions]
        self.asked.append(keys)
        if ("t", 1) not in keys:
            await asyncio.get_running_loop().create_future()    # parked: never answered, only given up
            parts = [fm.PartitionData(partition_index=0, high_watermark=0)]
        else:
            parts = [fm.PartitionData(partition_index=0, high_watermark=0),
                     fm.PartitionData(partition_index=1, high_watermark=1, records=self.record)]
        return await _answered(fm.FetchResponse(responses=[fm.FetchableTopicResponse(topic="t", partitions=parts)]))

    def drop(self, purpose: str, broker_id: int) -> None:
        self.drops.append(purpose)


def _started(leader: Leader | ParkingLeader, follower: Follower, key: tuple[str, int], backoff_ms: int = 1000,
             max_wait_ms: int = 500) -> ReplicaFetcher:
    """A fetcher from broker 1 (the leader) for broker 2 (the follower), following `key`, running."""
    fetcher = ReplicaFetcher(1, follower, leader, FetcherConfig(replica_id=2, backoff_ms=backoff_ms,
                                                                max_wait_ms=max_wait_ms), clock=lambda: 0)
    fetcher.add(key, leader_epoch=1)
    fetcher.start()
    return fetcher


def test_the_hold_doubles_from_the_first_up_to_the_backoff_and_a_success_starts_it_over():
    st = FetchState(leader_epoch=3)
    assert [st.hold_ms(1000) for _ in range(9)] == [10, 20, 40, 80, 160, 320, 640, 1000, 1000]
    st.errors = 0                                       # what a fetch that appended does
    assert st.hold_ms(1000) == FIRST_HOLD_MS
    assert FetchState(leader_epoch=0).hold_ms(5) == 5   # a backoff below the first hold caps it


def test_a_follower_whose_leader_does_not_lead_yet_fetches_again_within_milliseconds_not_the_backoff():
    # The controller's LeaderAndIsr reached the follower before the leader: its first fetch is refused.
    # With replica.fetch.backoff.ms at a minute, a follower that waited the backoff would not append
    # within the test's deadline.
    async def go() -> None:
        leader, follower = Leader(refusals=1), Follower()
        fetcher = _started(leader, follower, KEY, backoff_ms=60_000)
        try:
            await until(lambda: follower.appended, "the follower to append")
        finally:
            await fetcher.aclose()
        assert follower.appended[0] == leader.record
        assert leader.fetched_at[1] - leader.fetched_at[0] >= FIRST_HOLD_MS / 1000 * 0.9
    asyncio.run(go())


def test_a_leader_that_keeps_refusing_is_asked_less_often_each_time_until_the_backoff():
    async def go() -> None:
        leader, follower = Leader(refusals=10**9), Follower()
        fetcher = _started(leader, follower, KEY, backoff_ms=320)
        try:
            await until(lambda: len(leader.fetched_at) >= 8, "eight fetches")
        finally:
            await fetcher.aclose()
        at = leader.fetched_at
        gaps = [b - a for a, b in zip(at, at[1:8])]
        for gap, hold_ms in zip(gaps, [10, 20, 40, 80, 160, 320, 320]):
            assert gap >= hold_ms / 1000 * 0.9, (gaps, hold_ms)
        assert at[3] - at[0] < 0.320, gaps              # three retries (70 ms of holds) inside one backoff
        assert follower.appended == []
        assert fetcher.partitions[KEY].errors >= 7
    asyncio.run(go())


def test_a_partition_added_while_a_fetch_is_parked_on_the_leader_is_fetched_at_once_on_a_new_connection():
    # The follower fetches partition 0 from an idle leader; a new topic's partition 1 comes to the same
    # fetcher. A follower that waited for the parked fetch would wait for ever here (the fake never answers it).
    async def go() -> None:
        leader, follower = ParkingLeader(), Follower()
        fetcher = _started(leader, follower, ("t", 0), max_wait_ms=60_000)
        try:
            await until(lambda: leader.asked, "the first fetch")
            parked = fetcher._inflight
            fetcher.add(("t", 0), leader_epoch=1)           # the same partition again: nothing to give up
            assert parked is not None and fetcher._inflight is parked and not parked.cancelled()
            fetcher.add(("t", 1), leader_epoch=1)
            await until(lambda: follower.appended, "the follower to append")
        finally:
            await fetcher.aclose()
        assert leader.drops == ["fetcher-1"]                # the parked fetch's connection is closed
        assert leader.asked[:2] == [[("t", 0)], [("t", 0), ("t", 1)]]
        assert follower.appended[0] == leader.record
    asyncio.run(go())


def test_closing_a_fetcher_while_its_fetch_is_parked_ends_it():
    async def go() -> None:
        leader, follower = ParkingLeader(), Follower()
        fetcher = _started(leader, follower, ("t", 0), max_wait_ms=60_000)
        await until(lambda: leader.asked, "the first fetch")
        await asyncio.wait_for(fetcher.aclose(), 5)
        assert fetcher._task is not None and fetcher._task.cancelled()
        assert leader.drops == []
    asyncio.run(go())
