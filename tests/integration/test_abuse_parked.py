"""The abuse suite, waiting requests (issue 26, "What it must contain" 4): requests that wait for something
outside the broker - long-poll Fetches for data that does not come, classic JoinGroups for a member that
does not rejoin - are parked: they give their count in `queued.max.requests` back while they wait, so
however many there are, the broker goes on reading and answering everyone else; and a Fetch waits at
most `fetch.purgatory.max.wait.ms`, whatever `max_wait_ms` it asks.

Before, 500 idle long polls (the default `queued.max.requests`) from one host stopped the broker reading
every established connection for as long as they asked to wait. This module halves the budget (250), so
that 300 waiting joins are more than it holds; the 500 fetches are twice it. For each attack here:
another client's round trips stay under 250 ms, real clients (confluent-kafka, kafka-python) work
normally, RSS grows by at most 8x the bytes sent + 64 MiB, and records written before and after are
read back by confluent-kafka, kafka-python and aiokafka."""

from __future__ import annotations

import selectors
import struct
import time

import pytest
from kafka.protocol.consumer import FetchResponse
from kafka.protocol.consumer.group import JoinGroupRequest, JoinGroupResponse, SyncGroupRequest, SyncGroupResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

from .abuse_support import assert_all_read_back, assert_rss_bounded, pinging, three_client_round_trip
from .clients import (
    Msg, RawClient, connect, consume_confluent, fetch_v4, kafka_python_consumer, produce_confluent, recv_frame,
    wait_until,
)

FETCH_WAIT_CAP_MS = 8000
REQUESTS_BUDGET = 250         # queued.max.requests: half the default, so fewer waiting joins fill it
BROKER_OVERRIDES = {"auto.create.topics.enable": "true", "num.partitions": "1",
                    "queued.max.requests": str(REQUESTS_BUDGET),
                    "fetch.purgatory.max.wait.ms": str(FETCH_WAIT_CAP_MS),
                    "group.initial.rebalance.delay.ms": "0"}
PARKED_FETCHES = 500          # queued.max.requests' default: before, as many idle fetches filled it
PARKED_JOINS = 300            # more than this module's queued.max.requests
STALL_MAX_S = 0.25
SLACK_S = 3.0                 # how late a parked request may be answered on a loaded machine
NONE = 0
COORDINATOR_LOAD_IN_PROGRESS = 14
REBALANCE_IN_PROGRESS = 27


@pytest.fixture(scope="module")
def before(broker):
    """Records written before any abuse; every test checks they are still read back afterwards."""
    topic = "abuse-parked"
    values = three_client_round_trip(broker.bootstrap, topic, "before")
    # The first FindCoordinator creates __consumer_offsets, 50 partitions at once: done here, before any
    # attack, so that the stalls measured below are the attacks'.
    with RawClient(broker.bootstrap) as raw:
        wait_until(lambda: _coordinator_ready(raw, "abuse-parked-group"), 30, "the group coordinator")
    return topic, values


def after_abuse(broker, before, tag: str) -> None:
    topic, values = before
    assert broker.running, "the broker died"
    values += three_client_round_trip(broker.bootstrap, topic, tag)
    assert_all_read_back(broker.bootstrap, topic, values)


def assert_no_stall(pinger) -> None:
    worst = max(pinger.waits)
    assert worst < STALL_MAX_S, f"another client waited {worst * 1000:.0f} ms for an answer"


def answers_by_time(socks: dict, deadline_s: float) -> dict:
    """Read one answer from each socket as it comes: {socket: (monotonic arrival time, frame)}."""
    out = {}
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(True)
        sel.register(s, selectors.EVENT_READ)
    try:
        while len(out) < len(socks):
            remaining = deadline_s - time.monotonic()
            assert remaining > 0, f"only {len(out)} of {len(socks)} parked requests answered in time"
            for key, _ in sel.select(remaining):
                s = key.fileobj
                frame = recv_frame(s, timeout=10.0)
                assert frame is not None, "the broker closed a parked request's connection"
                out[s] = (time.monotonic(), frame)
                sel.unregister(s)
    finally:
        sel.close()
    return out


def test_idle_long_polls_are_parked_and_answered_at_the_cap(broker, before):
    """500 Fetches on 500 connections from one host, each asking to wait 10 minutes for a topic that gets
    no data: the broker keeps serving another client and a confluent-kafka producer and consumer, and
    answers each fetch, empty, once fetch.purgatory.max.wait.ms has passed."""
    idle = "parked-idle"
    produce_confluent(broker.bootstrap, idle, [Msg(b"k", b"only", (), None)])
    busy = "parked-busy"
    produce_confluent(broker.bootstrap, busy, [Msg(b"k", b"first", (), None)])
    rss0 = broker.rss_kb()
    socks: dict = {}
    bytes_sent = 0
    with pinging(broker) as pinger:
        for i in range(PARKED_FETCHES):
            frame = fetch_v4(i, idle, 0, 1, max_wait_ms=600_000)      # at the log end: nothing to send
            s = connect(broker.host, broker.port)
            s.sendall(frame)
            socks[s] = (i, time.monotonic())
            bytes_sent += len(frame)
        last_sent = time.monotonic()
        seen = pinger.answered
        wait_until(lambda: pinger.answered >= seen + 5, 10, "the unrelated client answered meanwhile")
        # A real client produces and consumes while the fetches wait.
        values = [f"busy-{i}".encode() for i in range(200)]
        produce_confluent(broker.bootstrap, busy, [Msg(None, v, (), None) for v in values])
        assert [r.value for r in consume_confluent(broker.bootstrap, busy, (0,))] == [b"first", *values]
        served_within_s = time.monotonic() - last_sent
        assert served_within_s < FETCH_WAIT_CAP_MS / 1000, (
            f"the confluent client took {served_within_s:.1f} s: not done while the fetches were parked")
        assert_rss_bounded(broker, rss0, bytes_sent, f"{PARKED_FETCHES} parked fetches")
        answers = answers_by_time(socks, last_sent + FETCH_WAIT_CAP_MS / 1000 + SLACK_S)
    assert_no_stall(pinger)
    cap_s = FETCH_WAIT_CAP_MS / 1000
    for s, (arrived, frame) in answers.items():
        cid, sent = socks[s]
        waited = arrived - sent
        assert cap_s - 0.1 <= waited <= cap_s + SLACK_S, f"fetch {cid} answered after {waited:.2f} s"
        resp = FetchResponse.decode(frame, version=4, header=True)
        assert resp.header.correlation_id == cid
        (topic,) = resp.responses
        (part,) = topic.partitions
        assert part.error_code == NONE and part.high_watermark == 1 and not part.records
        s.close()
    after_abuse(broker, before, "after-fetches")


# ------------------------------------------------------------------------------------ classic JoinGroup
SLOW_REBALANCE_MS = 8000


def _join(group: str, member_id: str = "", rebalance_ms: int = SLOW_REBALANCE_MS) -> JoinGroupRequest:
    subscription = struct.pack(">hih", 0, 1, len(b"abuse-parked")) + b"abuse-parked" + struct.pack(">i", -1)
    return JoinGroupRequest(group_id=group, session_timeout_ms=30000, rebalance_timeout_ms=rebalance_ms,
                            member_id=member_id, protocol_type="consumer",
                            protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range",
                                                                                 metadata=subscription)])


def _joined(resp: JoinGroupResponse) -> JoinGroupResponse | None:
    assert resp.error_code in (NONE, COORDINATOR_LOAD_IN_PROGRESS), f"JoinGroup: error {resp.error_code}"
    return resp if resp.error_code == NONE else None


def _coordinator_ready(raw: RawClient, group: str) -> bool:
    resp = raw.call(FindCoordinatorRequest(key=group, key_type=0), FindCoordinatorResponse, 1)
    return resp.error_code == NONE


def test_joins_waiting_for_a_slow_member_are_parked(broker, before):
    """A classic group whose one member (A) joined and synced, then stops: 300 new members join it on
    300 connections, and every JoinGroup waits for A to rejoin, up to the group's rebalance timeout.
    Meanwhile another client is answered and a kafka-python consumer joins another group and consumes;
    the parked joins are answered, without A, once the rebalance timeout has passed. Then 299 of them
    wait in SyncGroup for a leader that never sends its assignment, parked the same way."""
    group = "parked-slow-group"
    with RawClient(broker.bootstrap) as slow:
        wait_until(lambda: _coordinator_ready(slow, group), 30, "the group coordinator")
        # retried while the coordinator loads (COORDINATOR_LOAD_IN_PROGRESS), as clients do
        joined = wait_until(lambda: _joined(slow.call(_join(group), JoinGroupResponse, 3)), 30, "A's join")
        assert joined.leader == joined.member_id
        synced = slow.call(SyncGroupRequest(group_id=group, generation_id=joined.generation_id,
                                            member_id=joined.member_id,
                                            assignments=[SyncGroupRequest.SyncGroupRequestAssignment(
                                                member_id=joined.member_id, assignment=b"")]),
                           SyncGroupResponse, 2)
        assert synced.error_code == NONE
        # A stays connected and silent: it neither heartbeats nor rejoins.
        topic, values = before
        rss0 = broker.rss_kb()
        socks: dict = {}
        bytes_sent = 0
        with pinging(broker) as pinger:
            for i in range(PARKED_JOINS):
                req = _join(group)
                req.with_header(correlation_id=i, client_id=f"parked-{i}")
                frame = bytes(req.encode(version=3, header=True, framed=True))
                s = connect(broker.host, broker.port)
                s.sendall(frame)
                socks[s] = (i, time.monotonic())
                bytes_sent += len(frame)
            first_sent = min(t for _, t in socks.values())
            seen = pinger.answered
            wait_until(lambda: pinger.answered >= seen + 5, 10, "the unrelated client answered meanwhile")
            # Another group's member joins, syncs and consumes while the joins wait.
            consumer = kafka_python_consumer(broker.bootstrap, group_id="parked-other-group",
                                             session_timeout_ms=10000)
            try:
                # its metadata first: kafka-python's leader assigns nothing for a topic it has no metadata for
                wait_until(lambda: consumer.partitions_for_topic(topic), 10, "the consumer's metadata")
                consumer.subscribe([topic])
                got: list[bytes] = []
                deadline = first_sent + SLOW_REBALANCE_MS / 1000
                while len(got) < len(values) and time.monotonic() < deadline:
                    for batch in consumer.poll(timeout_ms=200).values():
                        got.extend(m.value for m in batch)
                assert got == values, f"the other group's consumer read {len(got)} of {len(values)} records " \
                                      "while the joins were parked"
            finally:
                consumer.close()
            served_within_s = time.monotonic() - first_sent
            assert served_within_s < SLOW_REBALANCE_MS / 1000, (
                f"the kafka-python consumer took {served_within_s:.1f} s: not done while the joins were parked")
            assert_rss_bounded(broker, rss0, bytes_sent, f"{PARKED_JOINS} parked JoinGroups")
            answers = answers_by_time(socks, first_sent + SLOW_REBALANCE_MS / 1000 + SLACK_S)
        assert_no_stall(pinger)
        members = set()
        for s, (arrived, frame) in answers.items():
            cid, _ = socks[s]
            resp = JoinGroupResponse.decode(frame, version=3, header=True)
            assert resp.header.correlation_id == cid
            assert resp.error_code == NONE, f"JoinGroup {cid}: error {resp.error_code}"
            assert resp.generation_id == joined.generation_id + 1
            members.add(resp.member_id)
            # they waited for A, as long as the rebalance timeout counted from the first join, and no longer
            assert SLOW_REBALANCE_MS / 1000 - 0.1 <= arrived - first_sent <= SLOW_REBALANCE_MS / 1000 + SLACK_S
        assert len(members) == PARKED_JOINS and joined.member_id not in members
        # SyncGroup: the followers wait for the leader's assignment, which never comes, up to the
        # rebalance timeout from the join phase's end; then the leader is removed and they must rejoin.
        join_done = min(arrived for arrived, _ in answers.values())
        leader = next(JoinGroupResponse.decode(f, version=3, header=True).leader for _, f in answers.values())
        followers: dict = {}
        with pinging(broker) as pinger:
            for s, (_, frame) in answers.items():
                resp = JoinGroupResponse.decode(frame, version=3, header=True)
                if resp.member_id == leader:
                    continue
                req = SyncGroupRequest(group_id=group, generation_id=resp.generation_id, member_id=resp.member_id,
                                       assignments=[])
                req.with_header(correlation_id=PARKED_JOINS + socks[s][0], client_id="parked-sync")
                s.sendall(bytes(req.encode(version=2, header=True, framed=True)))
                followers[s] = (PARKED_JOINS + socks[s][0], time.monotonic())
            first_sync = min(t for _, t in followers.values())
            seen = pinger.answered
            wait_until(lambda: pinger.answered >= seen + 5, 10, "the unrelated client answered meanwhile")
            synced_answers = answers_by_time(followers, first_sync + SLOW_REBALANCE_MS / 1000 + SLACK_S)
        assert_no_stall(pinger)
        assert len(synced_answers) == PARKED_JOINS - 1
        for s, (arrived, frame) in synced_answers.items():
            resp = SyncGroupResponse.decode(frame, version=2, header=True)
            assert resp.header.correlation_id == followers[s][0]
            assert resp.error_code == REBALANCE_IN_PROGRESS, f"SyncGroup: error {resp.error_code}"
            # (join_done is when the first join answer arrived, a little after the sync timer started)
            assert SLOW_REBALANCE_MS / 1000 - 0.5 <= arrived - join_done <= SLOW_REBALANCE_MS / 1000 + SLACK_S
        for s in answers:
            s.close()
    after_abuse(broker, before, "after-joins")
