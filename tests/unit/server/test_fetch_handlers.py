"""Fetch and ListOffsets handlers on a typed context of in-memory collaborators (`fakes.py`): what a
consumer and a follower may read, long polls woken by appends, leader-epoch fencing and lookups by
time. Real clients read these answers in tests/integration; these check the decisions, in
milliseconds."""

import asyncio

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import fetch as m
from odradek.protocol.messages import list_offsets as lo
from odradek.records.header import iter_headers
from odradek.server.apis.fetch import handle_fetch
from odradek.server.apis.list_offsets import EARLIEST, LATEST, MAX_TIMESTAMP, handle_list_offsets
from tests.unit.server.fakes import Clock, FakeAlterPartition, batch, broker_config, context, make_services, topic

FETCH, LIST_OFFSETS = 1, 2


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 5))


def _fetch(name: str, offset: int, *, epoch: int = -1, replica_id: int = -1, max_wait_ms: int = 0,
           min_bytes: int = 1, partition: int = 0) -> m.FetchRequest:
    return m.FetchRequest(replica_id=replica_id, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=1 << 20,
                          isolation_level=0, session_id=0, session_epoch=-1, topics=[m.FetchTopic(
                              topic=name, partitions=[m.FetchPartition(
                                  partition=partition, current_leader_epoch=epoch, fetch_offset=offset,
                                  partition_max_bytes=1 << 20)])], forgotten_topics_data=[])


def _offsets(pd: m.PartitionData) -> list[int]:
    data = pd.records.read() if hasattr(pd.records, "read") else bytes(pd.records or b"")
    return [o for h in iter_headers(data) for o in range(h.base_offset, h.next_offset)]


def _append(services, name: str, *values: bytes, partition: int = 0, timestamps=None) -> None:
    rm = services.replica_manager
    rm.append_to_leader(rm.leader_partition(name, partition), batch(*values, timestamps=timestamps), 0,
                        log_append_time=False, required_acks=1)


def test_a_consumer_reads_below_the_high_watermark_and_a_follower_to_the_log_end():
    services = make_services(topic("f", replicas=[0, 1]), brokers=(0, 1), alter_partition=FakeAlterPartition())
    _append(services, "f", b"a", b"b", b"c")
    consumer = _run(handle_fetch(context(services, FETCH, 12), _fetch("f", 0))).responses[0].partitions[0]
    assert consumer.error_code == ErrorCode.NONE and consumer.high_watermark == 0 and _offsets(consumer) == []

    async def follower_then_consumer():
        follower = (await handle_fetch(context(services, FETCH, 12), _fetch("f", 0, replica_id=1))).responses[0]
        assert _offsets(follower.partitions[0]) == [0, 1, 2]
        await handle_fetch(context(services, FETCH, 12), _fetch("f", 3, replica_id=1))   # it has them all
        consumer = (await handle_fetch(context(services, FETCH, 12), _fetch("f", 0))).responses[0].partitions[0]
        assert consumer.high_watermark == 3 and _offsets(consumer) == [0, 1, 2]
        await services.replica_manager.aclose()

    _run(follower_then_consumer())


def test_fetch_errors_per_partition():
    services = make_services(topic("e", leader_epoch=4), topic("far", replicas=[1]), brokers=(0, 1))
    _append(services, "e", b"x")

    def error(request: m.FetchRequest) -> ErrorCode:
        return _run(handle_fetch(context(services, FETCH, 12), request)).responses[0].partitions[0].error_code

    assert error(_fetch("e", 0, epoch=3)) == ErrorCode.FENCED_LEADER_EPOCH
    assert error(_fetch("e", 0, epoch=5)) == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert error(_fetch("e", 0, epoch=4)) == ErrorCode.NONE
    assert error(_fetch("e", 2)) == ErrorCode.OFFSET_OUT_OF_RANGE
    assert error(_fetch("e", 0, partition=1)) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert error(_fetch("far", 0)) == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert error(_fetch("nope", 0)) == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_a_long_poll_is_answered_by_an_append():
    services = make_services(topic("p"))

    async def main():
        polling = asyncio.ensure_future(handle_fetch(context(services, FETCH, 12),
                                                     _fetch("p", 0, max_wait_ms=60_000)))
        await asyncio.sleep(0)
        assert not polling.done()
        _append(services, "p", b"late")
        pd = (await asyncio.wait_for(polling, 1)).responses[0].partitions[0]
        assert _offsets(pd) == [0]

    _run(main())


def test_a_long_poll_waits_at_most_the_broker_s_cap():
    """max_wait_ms is the client's; fetch.purgatory.max.wait.ms bounds it (the fake clock stands still,
    so the wait is the purgatory's own timer)."""
    services = make_services(topic("c"), config=broker_config(**{"fetch.purgatory.max.wait.ms": "50"}))

    async def main():
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await handle_fetch(context(services, FETCH, 12), _fetch("c", 0, max_wait_ms=600_000))
        waited = loop.time() - started
        assert 0.04 <= waited < 2, waited
        pd = response.responses[0].partitions[0]
        assert pd.error_code == ErrorCode.NONE and _offsets(pd) == []

    _run(main())


def test_list_offsets_by_special_and_real_timestamps():
    services = make_services(topic("o", leader_epoch=2))
    _append(services, "o", b"a", b"b", timestamps=[100, 300])
    _append(services, "o", b"c", timestamps=[200])

    def ask(timestamp: int, version: int = 8, epoch: int = -1):
        request = lo.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=[lo.ListOffsetsTopic(
            name="o", partitions=[lo.ListOffsetsPartition(partition_index=0, current_leader_epoch=epoch,
                                                          timestamp=timestamp)])])
        p = _run(handle_list_offsets(context(services, LIST_OFFSETS, version), request)).topics[0].partitions[0]
        return p.error_code, p.offset, p.timestamp

    assert ask(EARLIEST) == (ErrorCode.NONE, 0, -1)
    assert ask(LATEST) == (ErrorCode.NONE, 3, -1)
    assert ask(MAX_TIMESTAMP) == (ErrorCode.NONE, 1, 300)
    assert ask(MAX_TIMESTAMP, version=6)[0] == ErrorCode.UNSUPPORTED_VERSION
    assert ask(150) == (ErrorCode.NONE, 1, 300)
    assert ask(301)[1] == -1
    assert ask(LATEST, epoch=1)[0] == ErrorCode.FENCED_LEADER_EPOCH
    assert ask(LATEST, version=3, epoch=1)[0] == ErrorCode.NONE    # no current epoch before v4


def _session_fetch(session_id: int, epoch: int, named: dict[int, int]) -> m.FetchRequest:
    return m.FetchRequest(replica_id=1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                          session_id=session_id, session_epoch=epoch,
                          topics=[m.FetchTopic(topic="s", partitions=[
                              m.FetchPartition(partition=p, current_leader_epoch=0, fetch_offset=o,
                                               partition_max_bytes=1 << 20) for p, o in named.items()])]
                          if named else [], forgotten_topics_data=[])


def test_a_follower_s_session_answers_only_what_moved_and_still_notes_every_partition_s_fetch():
    clock = Clock()
    services = make_services(topic("s", 2, replicas=[0, 1]), brokers=(0, 1), clock=clock,
                             alter_partition=FakeAlterPartition())
    rm = services.replica_manager
    _append(services, "s", b"a", b"b", partition=0)

    def fetch(request: m.FetchRequest) -> tuple[int, dict[int, m.PartitionData]]:
        r = _run(handle_fetch(context(services, FETCH, 12), request))
        assert r.error_code == ErrorCode.NONE
        return r.session_id, {pd.partition_index: pd for t in r.responses for pd in t.partitions}

    sid, first = fetch(_session_fetch(0, 0, {0: 0, 1: 0}))            # the session starts: everything
    assert sid and sorted(first) == [0, 1] and _offsets(first[0]) == [0, 1] and first[0].high_watermark == 0

    clock.now_ms += 1_000
    _, second = fetch(_session_fetch(sid, 1, {0: 2}))                  # it has both records now
    assert sorted(second) == [0] and second[0].high_watermark == 2    # partition 1 idle: left out
    idle = rm.leader_partition("s", 1).followers[1]
    assert idle.last_fetch_ms == idle.last_caught_up_ms == clock.now_ms   # yet its fetch was noted

    clock.now_ms += 1_000
    _, third = fetch(_session_fetch(sid, 2, {}))
    assert third == {}
    assert rm.leader_partition("s", 0).followers[1].last_caught_up_ms == clock.now_ms

    _append(services, "s", b"c", partition=1)
    _, fourth = fetch(_session_fetch(sid, 3, {}))
    assert sorted(fourth) == [1] and _offsets(fourth[1]) == [0]


def test_only_a_caught_up_isr_follower_with_unchanged_offsets_is_passed_over_as_idle():
    clock = Clock()
    services = make_services(topic("i", 1, replicas=[0, 1, 2], isr=[0, 1]), brokers=(0, 1, 2), clock=clock,
                             alter_partition=FakeAlterPartition())
    rm = services.replica_manager
    _append(services, "i", b"a", b"b")
    part = rm.leader_partition("i", 0)
    for replica in (1, 2):
        part.update_follower_fetch_state(replica, 2, clock.now_ms)
    state = (part.high_watermark, part.last_stable_offset, part.log_start_offset)
    clock.now_ms += 500

    assert rm.follower_idle("i", 0, 2, 0, 1, state, clock.now_ms)
    assert part.followers[1].last_caught_up_ms == part.followers[1].last_fetch_ms == clock.now_ms
    assert not rm.follower_idle("i", 0, 2, 0, 2, state, clock.now_ms)     # outside the ISR: may join it
    assert not rm.follower_idle("i", 0, 1, 0, 1, state, clock.now_ms)     # behind the log end
    assert not rm.follower_idle("i", 0, 2, 1, 1, state, clock.now_ms)     # another leader epoch
    assert not rm.follower_idle("i", 0, 2, 0, 1, (state[0] - 1, *state[1:]), clock.now_ms)  # answered an older HW
    assert not rm.follower_idle("i", 1, 2, 0, 1, state, clock.now_ms)     # no such partition
    _append(services, "i", b"c")
    assert not rm.follower_idle("i", 0, 2, 0, 1, state, clock.now_ms)     # records to send
