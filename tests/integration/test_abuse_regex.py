"""The abuse suite, subscription regexes (issue 26, "What it must contain" 1): ConsumerGroupHeartbeat
requests whose `SubscribedTopicRegex` used to freeze the broker. Python's backtracking `re` took seconds,
doubling with each character, for `(a+)+`-like patterns against a topic named with many `a`s, and a
1 MiB pattern stalled the broker 3.6 s and cost 125 MiB. With RE2 (linear time, Kafka's RE2/J
semantics), a bounded pattern length and matching in slices of bounded work, for each attack: the
broker answers it, an unrelated client's round trips stay under 250 ms, RSS grows by at most 8x the
bytes sent + 64 MiB, and records written before and after are read back by confluent-kafka,
kafka-python and aiokafka. A legitimate regex subscription still works end to end with librdkafka.

Requests are raw frames built with odradek's own encoder (a client library would refuse or rewrite
these patterns before sending them); what is tested is the broker's answer."""

from __future__ import annotations

import itertools
import random
import struct
import time
import uuid

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from odradek.coordinator.topic_regex import MAX_REGEX_BYTES
from odradek.protocol.api import decode_response, encode_request
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from odradek.protocol.messages import find_coordinator as fc

from .abuse_support import assert_all_read_back, assert_rss_bounded, pinging, three_client_round_trip
from .clients import connect, recv_frame, wait_until

BROKER_OVERRIDES = {"group.consumer.regex.refresh.interval.ms": 1000}
MAX_WAIT_S = 0.25
A_TOPIC = "a" * 60
TOPIC = "abuse-rx-records"


def create_topics(bootstrap: str, names: list[str], partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        f.result(60)


@pytest.fixture(scope="module")
def before(broker):
    """Records written before any abuse, and the topic of 60 `a`s the patterns are matched against."""
    create_topics(broker.bootstrap, [TOPIC, A_TOPIC])
    hb = Heartbeats(broker)
    try:
        hb.coordinator_ready()
    finally:
        hb.close()
    return TOPIC, three_client_round_trip(broker.bootstrap, TOPIC, "before")


def after_abuse(broker, before, tag: str) -> None:
    topic, values = before
    assert broker.running, "the broker died"
    values += three_client_round_trip(broker.bootstrap, topic, tag)
    assert_all_read_back(broker.bootstrap, topic, values)


class Heartbeats:
    """One connection sending ConsumerGroupHeartbeat v1 as raw frames (odradek's encoder)."""

    VERSION = 1

    def __init__(self, broker) -> None:
        self.sock = connect(broker.host, broker.port, timeout=30)
        self.ids = itertools.count(1)
        self.sent = 0

    def send(self, request, api_key: int = cgh.API_KEY, version: int = VERSION):
        w = encode_request(RequestHeader(api_key, version, next(self.ids), "abuse-regex"), request)
        frame = b"".join(bytes(c) for c in w.chunks())
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        self.sent += 4 + len(frame)
        answer = recv_frame(self.sock, 60)
        assert answer is not None, "the broker closed the connection instead of answering"
        return decode_response(api_key, version, answer)[1]

    def coordinator_ready(self) -> None:
        """FindCoordinator (which creates the offsets topic), then a probe member joins and leaves once
        the coordinator has loaded its partitions."""
        found = self.send(fc.FindCoordinatorRequest(key_type=0, coordinator_keys=["rx-probe"]), fc.API_KEY, 4)
        assert found.coordinators[0].error_code in (ErrorCode.NONE, ErrorCode.COORDINATOR_NOT_AVAILABLE)

        def joined():
            r = self.join("rx-probe", "probe", "probe-member")
            return r if r.error_code == ErrorCode.NONE else None
        wait_until(joined, 60, "the group coordinator ready")
        self.leave("rx-probe", "probe-member")

    def join(self, group: str, regex: str, member_id: str | None = None) -> cgh.ConsumerGroupHeartbeatResponse:
        return self.send(cgh.ConsumerGroupHeartbeatRequest(
            group_id=group, member_id=member_id or str(uuid.uuid4()), member_epoch=0, rebalance_timeout_ms=30_000,
            subscribed_topic_regex=regex, topic_partitions=[]))

    def beat(self, group: str, member_id: str, epoch: int) -> cgh.ConsumerGroupHeartbeatResponse:
        return self.send(cgh.ConsumerGroupHeartbeatRequest(group_id=group, member_id=member_id, member_epoch=epoch))

    def leave(self, group: str, member_id: str) -> None:
        assert self.send(cgh.ConsumerGroupHeartbeatRequest(group_id=group, member_id=member_id,
                                                           member_epoch=-1)).error_code == ErrorCode.NONE

    def close(self) -> None:
        self.sock.close()


def assigned_topic_ids(answer: cgh.ConsumerGroupHeartbeatResponse) -> set:
    return {tp.topic_id for tp in answer.assignment.topic_partitions} if answer.assignment else set()


def topic_id(bootstrap: str, name: str) -> uuid.UUID:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (described,) = admin.describe_topics(ck.TopicCollection([name])).values()
    tid = described.result(30).topic_id
    mask = (1 << 64) - 1
    return uuid.UUID(int=(tid.get_most_significant_bits() & mask) << 64 | tid.get_least_significant_bits() & mask)


def assert_answered_quickly(pinger) -> None:
    assert pinger.answered >= 3, f"the unrelated client was answered only {pinger.answered} times"
    assert max(pinger.waits) < MAX_WAIT_S, f"an unrelated round trip took {max(pinger.waits) * 1000:.0f} ms"


# Patterns that take a backtracking engine exponential time against a run of `a`s (they fail at its end
# or try every split of it): with RE2 each is a pass over the name.
CATASTROPHIC = ["(a+)+b", "(a|aa)+b", "(a|a)+b", "(.*a){30}b", "(a*)*b", "((a+)+)+b", "(\\w+)+!"]


def test_catastrophic_backtracking_patterns_are_matched_in_linear_time(broker, before):
    wanted = topic_id(broker.bootstrap, A_TOPIC)
    hb = Heartbeats(broker)
    rss0 = broker.rss_kb()
    members = []
    try:
        with pinging(broker) as pinger:
            for i, regex in enumerate(CATASTROPHIC):
                group = f"rx-catastrophic-{i}"
                answer = hb.join(group, regex)
                assert answer.error_code == ErrorCode.NONE, (regex, answer)
                assert assigned_topic_ids(answer) == set(), regex     # none of them matches a name
                members.append((group, answer.member_id))
            # `(a+)+` matches the whole name: the member is assigned its partition.
            answer = hb.join("rx-nested", "(a+)+")
            assert answer.error_code == ErrorCode.NONE, answer
            members.append(("rx-nested", answer.member_id))
            member_id, epoch = answer.member_id, answer.member_epoch

            def assigned():
                nonlocal epoch
                r = hb.beat("rx-nested", member_id, epoch)
                assert r.error_code == ErrorCode.NONE, r
                epoch = r.member_epoch
                return r if wanted in assigned_topic_ids(r) else None

            wait_until(lambda: wanted in assigned_topic_ids(answer) or assigned(), 30,
                       "the member of (a+)+ assigned the topic of 60 a's")
            wait_until(lambda: pinger.answered >= 3, 30, "the unrelated client answered")
        assert_answered_quickly(pinger)
        assert_rss_bounded(broker, rss0, hb.sent, "catastrophic-backtracking regexes")
        for group, member in members:
            hb.leave(group, member)
    finally:
        hb.close()
    after_abuse(broker, before, "after-catastrophic")


def test_a_1_mib_regex_is_refused_without_being_compiled(broker, before):
    """Twenty 1 MiB patterns: each answered INVALID_REGULAR_EXPRESSION with a short message (the pattern
    is not echoed back), none compiled; a pattern of exactly the bound is accepted."""
    hb = Heartbeats(broker)
    rss0 = broker.rss_kb()
    try:
        with pinging(broker) as pinger:
            for i in range(20):
                huge = "(a+)+" * ((1 << 20) // 5) + str(i)
                answer = hb.join("rx-huge", huge)
                assert answer.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION, answer.error_code
                assert answer.error_message == (f"SubscribedTopicRegex is too long ({len(huge)} characters): "
                                                f"at most {MAX_REGEX_BYTES} bytes of UTF-8 are accepted.")
            at_bound = "(?:" + "|".join(itertools.repeat("a+", (MAX_REGEX_BYTES - 4) // 3)) + ")"
            at_bound += "x" * (MAX_REGEX_BYTES - len(at_bound))
            answer = hb.join("rx-at-bound", at_bound)
            assert answer.error_code == ErrorCode.NONE, answer
            hb.leave("rx-at-bound", answer.member_id)
            wait_until(lambda: pinger.answered >= 3, 30, "the unrelated client answered")
        assert_answered_quickly(pinger)
        assert_rss_bounded(broker, rss0, hb.sent, "twenty 1 MiB regexes")
    finally:
        hb.close()
    after_abuse(broker, before, "after-huge")


REFUSED = ["(a)\\1", "(?=a)a+", "(?<=a)b", "a\\Z", "[", "(?:a{100}){100}", "a{1,249}" * 5, "\\pL" * 20,
           "(?:(?:(?:[a-z]{0,10}){0,10}){0,9})" * 30]


def test_what_re2_refuses_or_the_bounds_exclude_is_an_invalid_regular_expression(broker, before):
    """Backreferences, lookaround and Python-only escapes (RE2 refuses them, as Kafka's RE2/J does), and
    the patterns whose compile cost outgrows their length (counted repetitions, Unicode classes, a program
    larger than its memory bound): each answered INVALID_REGULAR_EXPRESSION in Kafka's words."""
    hb = Heartbeats(broker)
    rss0 = broker.rss_kb()
    try:
        with pinging(broker) as pinger:
            for regex in REFUSED * 10:
                answer = hb.join("rx-refused", regex)
                assert answer.error_code == ErrorCode.INVALID_REGULAR_EXPRESSION, (regex, answer)
                assert answer.error_message.startswith(f"SubscribedTopicRegex `{regex}` is not a valid regular "
                                                       "expression: "), answer.error_message
            wait_until(lambda: pinger.answered >= 3, 30, "the unrelated client answered")
        assert_answered_quickly(pinger)
        assert_rss_bounded(broker, rss0, hb.sent, "regexes RE2 refuses")
    finally:
        hb.close()
    after_abuse(broker, before, "after-refused")


def test_a_costly_regex_over_long_topic_names_is_matched_in_slices(broker, before):
    """Regexes RE2's DFA cannot cache (it falls back to its NFA: milliseconds per 249-character name),
    ending in `\\z` so that they are matched name by name, resolved against a hundred such names: about
    0.6 s of matching each, which held the loop that long when done in one go. The matching runs in slices
    with the event loop turning between them, so the unrelated client is answered meanwhile."""
    rng = random.Random(26)
    names = ["".join(rng.choice("ab") for _ in range(249)) for _ in range(100)]
    create_topics(broker.bootstrap, names)
    hb = Heartbeats(broker)
    rss0 = broker.rss_kb()
    try:
        with pinging(broker) as pinger:
            for i in range(4):
                regex = f"(?:(?:(a|b)*a(a|b){{30}}){{1,{10 + i}}})" * 4 + "\\z"
                answer = hb.join(f"rx-costly-{i}", regex)
                assert answer.error_code == ErrorCode.NONE, answer
                hb.leave(f"rx-costly-{i}", answer.member_id)
            wait_until(lambda: pinger.answered >= 3, 30, "the unrelated client answered")
        assert_answered_quickly(pinger)
        assert_rss_bounded(broker, rss0, hb.sent, "costly regexes over 100 long names")
    finally:
        hb.close()
    after_abuse(broker, before, "after-costly")


def test_a_legitimate_regex_subscription_consumes_end_to_end(broker, before):
    """librdkafka with the consumer group protocol subscribes by regex (`^abuse-rx-.*`): the coordinator
    resolves it with RE2, assigns the topic, and the consumer reads every record written so far."""
    topic, values = before
    c = ck.Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "rx-legit", "group.protocol": "consumer",
                     "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 1000})
    got: list[bytes] = []
    try:
        c.subscribe(["^abuse-rx-.*"])
        deadline = time.monotonic() + 60
        while len(got) < len(values):
            assert time.monotonic() < deadline, f"read {len(got)} of {len(values)} records"
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
        assert {tp.topic for tp in c.assignment()} == {topic}
    finally:
        c.close()
    assert sorted(got) == sorted(values)


def test_list_transactions_patterns_are_matched_with_re2(broker, before):
    """ListTransactions v2's TransactionalIdPattern (KIP-1152) goes through the same RE2 matcher: a
    catastrophic pattern against a transactional id of 60 `a`s is answered at once, a pattern RE2
    refuses is INVALID_REQUEST, and a plain pattern still lists the transaction."""
    from odradek.protocol.messages import list_transactions as lt
    txn_id = "a" * 60
    producer = ck.Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": txn_id})
    producer.init_transactions(60)
    hb = Heartbeats(broker)
    try:
        with pinging(broker) as pinger:
            def listing(pattern: str) -> lt.ListTransactionsResponse:
                return hb.send(lt.ListTransactionsRequest(transactional_id_pattern=pattern), lt.API_KEY, 2)

            wait_until(lambda: txn_id in {t.transactional_id for t in listing("a+").transaction_states}, 30,
                       "the transaction listed by a plain pattern")
            for regex in CATASTROPHIC:
                answer = listing(regex)
                assert answer.error_code == ErrorCode.NONE, (regex, answer)
                assert txn_id not in {t.transactional_id for t in answer.transaction_states}, regex
            assert txn_id in {t.transactional_id for t in listing("(a+)+").transaction_states}
            for regex in ("(a)\\1", "(?=a)a+", "x" * (MAX_REGEX_BYTES + 1)):
                assert listing(regex).error_code == ErrorCode.INVALID_REQUEST, regex
            wait_until(lambda: pinger.answered >= 3, 30, "the unrelated client answered")
        assert_answered_quickly(pinger)
    finally:
        hb.close()
        producer.flush(10)
    after_abuse(broker, before, "after-list-transactions")
