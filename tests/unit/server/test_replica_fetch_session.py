"""The follower's side of KIP-227 fetch sessions (server/replica_fetch_session.py), and a replica
fetcher using it against a leader that keeps sessions as KIP-227 says: the first request names every
partition, later ones only what moved, and every way a session can break starts it over."""

from __future__ import annotations

import asyncio

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import fetch as fm
from odradek.server.replica_fetch_session import FetchSessionHandler
from odradek.server.replica_fetcher import FetcherConfig, ReplicaFetcher
from tests.unit.server.fakes import until
from tests.unit.server.test_replica_fetcher import _answered, _one_record

A0, A1, B0 = ("a", 0), ("a", 1), ("b", 0)


def _named(request) -> dict[tuple[str, int], int]:
    return {(t.topic, p.partition): p.fetch_offset for t in request.topics for p in t.partitions}


def _forgotten(request) -> set[tuple[str, int]]:
    return {(t.topic, p) for t in request.forgotten for p in t.partitions}


def _answer(session_id: int, error: ErrorCode = ErrorCode.NONE) -> fm.FetchResponse:
    return fm.FetchResponse(error_code=error.value, session_id=session_id, responses=[])


def test_a_session_starts_full_then_names_only_what_moved_and_forgets_what_went():
    h = FetchSessionHandler()
    first = h.build({A0: (5, 1, 100), A1: (7, 1, 100), B0: (0, 3, 100)})
    assert (first.session_id, first.epoch) == (0, 0)
    assert _named(first) == {A0: 5, A1: 7, B0: 0} and not _forgotten(first)
    assert h.succeeded(_answer(42))

    same = h.build({A0: (5, 1, 100), A1: (7, 1, 100), B0: (0, 3, 100)})
    assert (same.session_id, same.epoch) == (42, 1)
    assert _named(same) == {} and not _forgotten(same)
    assert h.succeeded(_answer(42))

    # A0 appended, B0's leader epoch moved, A1 is held back (not fetched now): forgotten.
    moved = h.build({A0: (9, 1, 100), B0: (0, 4, 100)})
    assert (moved.session_id, moved.epoch) == (42, 2)
    assert _named(moved) == {A0: 9, B0: 0} and _forgotten(moved) == {A1}
    assert h.succeeded(_answer(42))

    back = h.build({A0: (9, 1, 100), A1: (7, 1, 100), B0: (0, 4, 100)})
    assert back.epoch == 3 and _named(back) == {A1: 7} and not _forgotten(back)


def test_an_unanswered_request_or_a_wrong_epoch_reopens_the_session_under_its_id():
    h = FetchSessionHandler()
    h.build({A0: (1, 1, 100)})
    h.succeeded(_answer(7))
    h.build({A0: (2, 1, 100)})
    h.failed()                              # the leader may or may not have taken epoch 1
    again = h.build({A0: (2, 1, 100)})
    assert (again.session_id, again.epoch) == (7, 0) and _named(again) == {A0: 2}
    assert h.succeeded(_answer(8))

    h.build({A0: (2, 1, 100)})
    assert not h.succeeded(_answer(8, ErrorCode.INVALID_FETCH_SESSION_EPOCH))
    reopened = h.build({A0: (2, 1, 100)})
    assert (reopened.session_id, reopened.epoch) == (8, 0) and _named(reopened) == {A0: 2}


def test_an_unknown_session_starts_a_new_one_and_a_leader_without_sessions_is_asked_in_full():
    h = FetchSessionHandler()
    h.build({A0: (1, 1, 100)})
    h.succeeded(_answer(7))
    h.build({A0: (1, 1, 100)})
    assert not h.succeeded(_answer(0, ErrorCode.FETCH_SESSION_ID_NOT_FOUND))
    fresh = h.build({A0: (1, 1, 100)})
    assert (fresh.session_id, fresh.epoch) == (0, 0) and _named(fresh) == {A0: 1}

    assert h.succeeded(_answer(0))          # no session created (Fetch before v7, or no cache slot)
    for _ in range(2):
        full = h.build({A0: (1, 1, 100), A1: (0, 1, 100)})
        assert (full.session_id, full.epoch) == (0, 0) and _named(full) == {A0: 1, A1: 0}
        assert h.succeeded(_answer(0))


class Replicas:
    """Two followed partitions of topic "a": each record appended moves its log end by one."""

    def __init__(self) -> None:
        self.log_end = {A0: 0, A1: 0}

    def follower_log_end_offset(self, topic: str, index: int) -> int | None:
        return self.log_end[(topic, index)]

    def follower_latest_epoch(self, topic: str, index: int) -> int | None:
        return None

    def follower_truncation_point(self, topic: str, index: int, leader_epoch: int,
                                  leader_end_offset: int) -> int | None:
        return None

    def truncate_follower(self, topic: str, index: int, offset: int, *, fully: bool, now_ms: int) -> None:
        raise AssertionError("nothing to truncate")

    def append_to_follower(self, topic: str, index: int, records, leader_high_watermark: int, now_ms: int) -> object:
        self.log_end[(topic, index)] += 1
        return None

    def update_follower_from_leader(self, topic: str, index: int, leader_high_watermark: int) -> None:
        pass


class SessionLeader:
    """Keeps one session (id 9) as a broker does, and answers from a script: each fetch gets the next
    entry, a partition to send one record for, or None to park until the fetch is given up."""

    def __init__(self, script: list) -> None:
        self.script = script
        self.requests: list[fm.FetchRequest] = []
        self.epoch = 0
        self.record = _one_record()

    async def request(self, purpose: str, broker_id: int, api_key: int, body: object, *,
                      timeout_ms: int | None = None) -> object:
        assert isinstance(body, fm.FetchRequest)
        self.requests.append(body)
        if body.session_epoch == 0:
            self.epoch = 1
        elif body.session_epoch != self.epoch:
            return await _answered(_answer(9, ErrorCode.INVALID_FETCH_SESSION_EPOCH))
        else:
            self.epoch += 1
        step = self.script.pop(0) if self.script else None
        if step is None:
            await asyncio.get_running_loop().create_future()      # parked until given up
        part = fm.PartitionData(partition_index=step[1], high_watermark=1, records=self.record)
        return await _answered(fm.FetchResponse(session_id=9, responses=[
            fm.FetchableTopicResponse(topic=step[0], partitions=[part])]))

    def drop(self, purpose: str, broker_id: int) -> None:
        pass


def test_a_fetcher_names_only_the_partition_it_appended_to_and_reopens_its_session_after_giving_up_a_fetch():
    async def main() -> None:
        replicas = Replicas()
        leader = SessionLeader([A0, A0, A1, None])
        fetcher = ReplicaFetcher(1, replicas, leader, FetcherConfig(replica_id=2), clock=lambda: 0)
        fetcher.add(A0, leader_epoch=1)
        fetcher.add(A1, leader_epoch=1)
        fetcher.start()
        try:
            await until(lambda: len(leader.requests) == 4)
            sent = [(r.session_id, r.session_epoch, _named(r)) for r in leader.requests]
            assert sent == [(0, 0, {A0: 0, A1: 0}),       # full: the session starts
                            (9, 1, {A0: 1}),               # A0 got a record; A1 unchanged
                            (9, 2, {A0: 2}),
                            (9, 3, {A1: 1})]               # parked
            assert replicas.log_end == {A0: 2, A1: 1}
            replicas.log_end[("a", 2)] = 0
            fetcher.add(("a", 2), leader_epoch=1)          # gives the parked fetch up
            await until(lambda: len(leader.requests) == 5)
            last = leader.requests[-1]
            assert (last.session_id, last.session_epoch) == (9, 0)
            assert _named(last) == {A0: 2, A1: 1, ("a", 2): 0}
        finally:
            await fetcher.aclose()

    asyncio.run(main())
