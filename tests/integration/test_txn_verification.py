"""KIP-890 against a real broker: transactional writes verified with the transaction coordinator
(part 1), and the transaction protocol v2 (part 2), spoken with raw requests of every relevant
version (seed 003, "Message Delivery Semantics"; Kafka 4.0's rules for each version).

Part 1: a transactional batch for a partition its transaction does not hold is refused before it can
open a transaction nobody would end (INVALID_TXN_STATE below Produce v11, TRANSACTION_ABORTABLE from
v11), nothing is appended and the last stable offset stays at the high watermark; with
`transaction.partition.verification.enable=false` the same batch is appended and hangs, holding the
last stable offset back, which is what the check prevents.

Part 2: no AddPartitionsToTxn or AddOffsetsToTxn; Produce v12 and TxnOffsetCommit v5 have the leader
add their partitions; EndTxn v5 bumps the epoch and answers it, retries are recognised, and a late
write of the previous transaction is fenced by its epoch.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time

from confluent_kafka import Producer

from odradek.protocol.api import decode_response, encode_request
from odradek.protocol.headers import RequestHeader
from odradek.protocol.messages import add_partitions_to_txn as ap
from odradek.protocol.messages import api_versions as av
from odradek.protocol.messages import describe_transactions as dt
from odradek.protocol.messages import end_txn as et
from odradek.protocol.messages import find_coordinator as fc
from odradek.protocol.messages import init_producer_id as ip
from odradek.protocol.messages import metadata as md
from odradek.protocol.messages import offset_fetch as of
from odradek.protocol.messages import produce as pr
from odradek.protocol.messages import txn_offset_commit as toc
from odradek.records.builder import RecordBatchBuilder
from odradek.records.header import TRANSACTIONAL_MASK

from .clients import connect, recv_frame, wait_until
from .txn_support import end_offsets, read_values

NONE = 0
NOT_ENOUGH_REPLICAS = 19
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
PRODUCER_FENCED = 90
TRANSACTION_ABORTABLE = 120


class Wire:
    """Requests built with odradek's encoder on one connection."""

    def __init__(self, broker) -> None:
        self.sock = connect(broker.host, broker.port)
        self.ids = itertools.count(1)

    def call(self, module, version: int, body):
        cid = next(self.ids)
        w = encode_request(RequestHeader(module.API_KEY, version, cid, "kip890-test"), body)
        frame = b"".join(bytes(c) if not hasattr(c, "read") else c.read() for c in w.chunks())
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        got_cid, response = decode_response(module.API_KEY, version, recv_frame(self.sock, 30))
        assert got_cid == cid
        return response

    def close(self) -> None:
        self.sock.close()


def txn_batch(pid: int, epoch: int, seq: int, value: bytes) -> bytes:
    b = RecordBatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    b.append(None, value, timestamp=time.time_ns() // 1_000_000)
    raw = b.build()
    assert raw[21:23] == (TRANSACTIONAL_MASK).to_bytes(2, "big")
    return raw


class Txn:
    """A transactional producer spoken by hand: its id, producer id and epoch, and a sequence per
    partition."""

    def __init__(self, wire: Wire, transactional_id: str, timeout_ms: int = 60_000) -> None:
        self.wire = wire
        self.id = transactional_id
        self.seq: dict[tuple[str, int], int] = {}
        deadline = time.monotonic() + 30
        while True:       # the coordinator loads __transaction_state on first use
            r = wire.call(fc, 1, fc.FindCoordinatorRequest(key=transactional_id, key_type=1))
            r = wire.call(ip, 4, ip.InitProducerIdRequest(transactional_id=transactional_id,
                                                         transaction_timeout_ms=timeout_ms,
                                                         producer_id=-1, producer_epoch=-1))
            if r.error_code == NONE or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert r.error_code == NONE, r
        self.pid, self.epoch = r.producer_id, r.producer_epoch

    def produce(self, topic: str, value: bytes, *, version: int, partition: int = 0,
                epoch: int | None = None, transactional_id: str | None = "") -> tuple[int, str | None]:
        tp = (topic, partition)
        seq = self.seq.get(tp, 0)
        r = self.wire.call(pr, version, pr.ProduceRequest(
            transactional_id=self.id if transactional_id == "" else transactional_id, acks=-1, timeout_ms=10_000,
            topic_data=[pr.TopicProduceData(name=topic, partition_data=[pr.PartitionProduceData(
                index=partition, records=txn_batch(self.pid, self.epoch if epoch is None else epoch, seq, value))])]))
        p = r.responses[0].partition_responses[0]
        if p.error_code == NONE:
            self.seq[tp] = seq + 1
        return p.error_code, p.error_message

    def add_partitions(self, topic: str, partition: int = 0) -> int:
        r = self.wire.call(ap, 3, ap.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.id, v3_and_below_producer_id=self.pid,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=[ap.AddPartitionsToTxnTopic(name=topic, partitions=[partition])]))
        return r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code

    def end(self, commit: bool, *, version: int, epoch: int | None = None):
        deadline = time.monotonic() + 30
        while True:
            r = self.wire.call(et, version, et.EndTxnRequest(
                transactional_id=self.id, producer_id=self.pid,
                producer_epoch=self.epoch if epoch is None else epoch, committed=commit))
            if r.error_code != 51 or time.monotonic() > deadline:   # CONCURRENT_TRANSACTIONS: retried
                return r
            time.sleep(0.05)

    def describe(self):
        r = self.wire.call(dt, 0, dt.DescribeTransactionsRequest(transactional_ids=[self.id]))
        return r.transaction_states[0]


def create_topic(wire: Wire, topic: str) -> None:
    r = wire.call(md, 4, md.MetadataRequest(topics=[md.MetadataRequestTopic(name=topic)],
                                            allow_auto_topic_creation=True))
    assert r.topics[0].error_code == NONE, r


def stable_and_high(broker, topic: str) -> tuple[int, int]:
    return end_offsets(broker.bootstrap, topic, 1, "read_committed")[0], \
        end_offsets(broker.bootstrap, topic, 1, "read_uncommitted")[0]


# ------------------------------------------------------------------------------------------ part 1
def test_a_write_outside_the_transaction_is_refused_per_produce_version(broker):
    wire = Wire(broker)
    topic = "kip890-verify"
    create_topic(wire, topic)
    t = Txn(wire, "kip890-verify-tx")
    # Never added to the transaction: v10 and below get INVALID_TXN_STATE (Kafka's message), v11
    # TRANSACTION_ABORTABLE; nothing is written.
    assert t.produce(topic, b"v10", version=10) == (INVALID_TXN_STATE, "Partition was not added to the transaction")
    assert t.produce(topic, b"v9", version=9)[0] == INVALID_TXN_STATE
    assert t.produce(topic, b"v11", version=11)[0] == TRANSACTION_ABORTABLE
    assert stable_and_high(broker, topic) == (0, 0)
    # Added: the first write is verified and opens the transaction; later writes need no check.
    assert t.add_partitions(topic) == NONE
    assert t.produce(topic, b"in-txn-1", version=10) == (NONE, None)
    assert t.produce(topic, b"in-txn-2", version=11) == (NONE, None)
    assert stable_and_high(broker, topic) == (0, 2)
    assert t.end(True, version=3).error_code == NONE
    wait_until(lambda: stable_and_high(broker, topic) == (3, 3), 20, "the commit marker")
    # The transaction is over: the same producer writing again without adding the partition is
    # refused; the partition keeps no open transaction.
    assert t.produce(topic, b"late", version=11)[0] == TRANSACTION_ABORTABLE
    assert stable_and_high(broker, topic) == (3, 3)
    # A transactional batch without a transactional id in the request cannot be verified.
    assert t.produce(topic, b"no-id", version=11, transactional_id=None)[0] == INVALID_TXN_STATE
    # An older epoch is the coordinator's PRODUCER_FENCED, answered as INVALID_PRODUCER_EPOCH.
    assert t.add_partitions(topic) == NONE
    assert t.produce(topic, b"old-epoch", version=11, epoch=t.epoch - 1 if t.epoch else 5)[0] \
        == INVALID_PRODUCER_EPOCH
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"in-txn-1", b"in-txn-2"]
    wire.close()


def test_without_verification_the_late_write_hangs(broker_factory):
    """The control case: `transaction.partition.verification.enable=false` appends the same write,
    which opens a transaction the coordinator does not know: the last stable offset stays behind."""
    broker = broker_factory(**{"transaction.partition.verification.enable": "false"})
    wire = Wire(broker)
    topic = "kip890-unverified"
    create_topic(wire, topic)
    t = Txn(wire, "kip890-unverified-tx")
    assert t.produce(topic, b"hanging", version=10) == (NONE, None)
    assert stable_and_high(broker, topic) == (0, 1)
    assert t.describe().transaction_state == "Empty"     # the coordinator knows of no transaction
    wire.close()


def test_api_versions_finalize_transaction_version_2(broker):
    wire = Wire(broker)
    r = wire.call(av, 3, av.ApiVersionsRequest(client_software_name="kip890", client_software_version="1"))
    assert ("transaction.version", 0, 2) in [(f.name, f.min_version, f.max_version) for f in r.supported_features]
    assert ("transaction.version", 2, 2) in [(f.name, f.min_version_level, f.max_version_level)
                                             for f in r.finalized_features]
    versions = {k.api_key: k.max_version for k in r.api_keys}
    assert versions[0] >= 12 and versions[26] >= 5 and versions[28] >= 5 and versions[24] >= 5
    wire.close()


# ------------------------------------------------------------------------------------------ part 2
def test_transaction_protocol_v2_adds_partitions_at_the_leader_and_bumps_the_epoch(broker):
    wire = Wire(broker)
    topic = "kip890-tv2"
    create_topic(wire, topic)
    t = Txn(wire, "kip890-tv2-tx")
    pid, epoch = t.pid, t.epoch
    # Produce v12 without AddPartitionsToTxn: the leader adds the partition to the transaction.
    assert t.produce(topic, b"first", version=12) == (NONE, None)
    assert t.produce(topic, b"second", version=12) == (NONE, None)
    state = t.describe()
    assert state.transaction_state == "Ongoing" and [(x.topic, list(x.partitions)) for x in state.topics] \
        == [(topic, [0])]
    # EndTxn v5 answers the next transaction's producer id and epoch: the epoch is bumped.
    r = t.end(True, version=5)
    assert (r.error_code, r.producer_id, r.producer_epoch) == (NONE, pid, epoch + 1)
    wait_until(lambda: t.describe().transaction_state == "CompleteCommit", 20, "the commit to complete")
    # A retry of that EndTxn (the old epoch) is recognised: NONE and the same answer.
    r = t.end(True, version=5)
    assert (r.error_code, r.producer_id, r.producer_epoch) == (NONE, pid, epoch + 1)
    # A write of the finished transaction arriving late is fenced by its epoch alone.
    assert t.produce(topic, b"late", version=12)[0] == INVALID_PRODUCER_EPOCH
    # The next transaction runs at the new epoch, its sequences from 0; an abort bumps again.
    t.epoch, t.seq = epoch + 1, {}
    assert t.produce(topic, b"aborted", version=12) == (NONE, None)
    r = t.end(False, version=5)
    assert (r.error_code, r.producer_id, r.producer_epoch) == (NONE, pid, epoch + 2)
    # The old epoch ending again is not a retry of this end: fenced. An abort of an empty
    # transaction at the current epoch still bumps it.
    assert t.end(False, version=5, epoch=epoch).error_code == PRODUCER_FENCED
    wait_until(lambda: t.describe().transaction_state == "CompleteAbort", 20, "the abort to complete")
    t.epoch = epoch + 2
    r = t.end(False, version=5)
    assert (r.error_code, r.producer_epoch) == (NONE, epoch + 3)
    assert t.end(True, version=5, epoch=epoch + 3).error_code == INVALID_TXN_STATE   # nothing to commit
    wait_until(lambda: stable_and_high(broker, topic)[0] == stable_and_high(broker, topic)[1], 20,
               "no open transaction on the partition")
    assert read_values(broker.bootstrap, topic, 1, "read_committed") == [b"first", b"second"]
    wire.close()


def test_end_txn_below_v5_keeps_the_epoch(broker):
    wire = Wire(broker)
    topic = "kip890-tv0"
    create_topic(wire, topic)
    t = Txn(wire, "kip890-tv0-tx")
    assert t.add_partitions(topic) == NONE
    assert t.produce(topic, b"v1", version=11) == (NONE, None)
    assert t.end(True, version=4).error_code == NONE
    wait_until(lambda: t.describe().transaction_state == "CompleteCommit", 20, "the commit to complete")
    assert t.describe().producer_epoch == t.epoch
    assert t.add_partitions(topic) == NONE
    assert t.produce(topic, b"v2", version=11) == (NONE, None)
    assert t.end(True, version=4).error_code == NONE
    wait_until(lambda: read_values(broker.bootstrap, topic, 1, "read_committed") == [b"v1", b"v2"], 20,
               "both transactions committed")
    wire.close()


def test_txn_offset_commit_v5_adds_the_offsets_partition(broker):
    wire = Wire(broker)
    topic, group = "kip890-offsets", "kip890-group"
    create_topic(wire, topic)
    t = Txn(wire, "kip890-offsets-tx")

    def commit_offsets(version: int, offset: int) -> int:
        deadline = time.monotonic() + 30
        while True:
            wire.call(fc, 1, fc.FindCoordinatorRequest(key=group, key_type=0))
            r = wire.call(toc, version, toc.TxnOffsetCommitRequest(
                transactional_id=t.id, group_id=group, producer_id=t.pid, producer_epoch=t.epoch,
                generation_id=-1, member_id="", group_instance_id=None,
                topics=[toc.TxnOffsetCommitRequestTopic(name=topic, partitions=[toc.TxnOffsetCommitRequestPartition(
                    partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")])]))
            code = r.topics[0].partitions[0].error_code
            if code not in (14, 15, 16) or time.monotonic() > deadline:   # the offsets topic still loading
                return code
            time.sleep(0.1)

    def committed() -> int:
        r = wire.call(of, 1, of.OffsetFetchRequest(group_id=group, topics=[of.OffsetFetchRequestTopic(
            name=topic, partition_indexes=[0])]))
        return r.topics[0].partitions[0].committed_offset

    # v4 only verifies: the offsets partition was never added (no AddOffsetsToTxn).
    assert commit_offsets(4, 7) == TRANSACTION_ABORTABLE
    assert commit_offsets(3, 7) == INVALID_TXN_STATE
    # v5: the group's offsets partition is added by its leader, and the offsets commit with the transaction.
    assert t.produce(topic, b"with-offsets", version=12) == (NONE, None)
    assert commit_offsets(5, 42) == NONE
    assert committed() == -1                          # pending until the marker
    partitions = {(x.topic, tuple(x.partitions)) for x in t.describe().topics}
    assert {name for name, _ in partitions} == {topic, "__consumer_offsets"}
    r = t.end(True, version=5)
    assert (r.error_code, r.producer_epoch) == (NONE, t.epoch + 1)
    wait_until(lambda: committed() == 42, 20, "the offsets to be committed by the marker")
    wire.close()


# ------------------------------------------------------------------------------- a real client, late
class HoldingProxy:
    """A TCP proxy in front of the broker that, once `holding`, keeps back the next Produce request
    (and what follows it on its connection) until `release()`, then delivers it on its own upstream
    connection even if the client has gone, and records the answer (error code of each partition)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self.holding = False
        self.held: list[tuple[socket.socket, bytes]] = []
        self.late_answers: list[int] = []
        self._late: set[tuple[int, int]] = set()     # (id of upstream socket, correlation id)
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=10)
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
            versions: dict[int, int] = {}
            threading.Thread(target=self._requests, args=(client, upstream, versions), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client, versions), daemon=True).start()

    def _requests(self, client, upstream, versions) -> None:
        held_here = False
        while (frame := _frame(client)) is not None:
            api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 0)
            versions[correlation_id] = version if api_key == pr.API_KEY else -1
            with self._lock:
                if (self.holding and api_key == pr.API_KEY) or held_here:
                    if not held_here and api_key == pr.API_KEY:
                        self._late.add((id(upstream), correlation_id))
                        self.holding = False
                    held_here = True
                    self.held.append((upstream, frame))
                    continue
            try:
                upstream.sendall(struct.pack(">i", len(frame)) + frame)
            except OSError:
                break
        if not held_here:
            _close(client, upstream)

    def _responses(self, upstream, client, versions) -> None:
        while (frame := _frame(upstream)) is not None:
            (correlation_id,) = struct.unpack_from(">i", frame, 0)
            version = versions.pop(correlation_id, -1)
            with self._lock:
                late = (id(upstream), correlation_id) in self._late
            if late and version >= 0:
                _, response = decode_response(pr.API_KEY, version, frame)
                with self._lock:
                    self.late_answers += [p.error_code for t in response.responses for p in t.partition_responses]
            try:
                client.sendall(struct.pack(">i", len(frame)) + frame)
            except OSError:
                pass                               # the client has gone; the answer is recorded above

    def release(self) -> None:
        with self._lock:
            held, self.held = self.held, []
        for upstream, frame in held:
            upstream.sendall(struct.pack(">i", len(frame)) + frame)

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        with self._lock:
            _close(*self._sockets)


def _frame(sock: socket.socket) -> bytes | None:
    try:
        return recv_frame(sock, 3600)
    except OSError:
        return None


def _close(*socks) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def _late_write_after_abort(broker_factory, overrides: dict) -> tuple[HoldingProxy, object, str]:
    """confluent-kafka's transactional producer writes one record whose Produce the proxy holds; the
    producer aborts the transaction (its in-flight request times out first) and starts and commits
    another one elsewhere; then the held Produce reaches the broker."""
    proxy = HoldingProxy()
    broker = broker_factory(**{"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}", **overrides})
    proxy.target = ("127.0.0.1", broker.port)
    topic, other = "kip890-late", "kip890-other"
    wire = Wire(broker)
    create_topic(wire, topic)
    create_topic(wire, other)
    wire.close()
    p = Producer({"bootstrap.servers": f"127.0.0.1:{proxy.port}", "transactional.id": "kip890-late-tx",
                  "transaction.timeout.ms": 60_000, "message.timeout.ms": 3000, "socket.timeout.ms": 10_000,
                  "linger.ms": 0})
    p.init_transactions(30)
    p.begin_transaction()
    proxy.holding = True
    failed: list[object] = []
    p.produce(topic, b"late", on_delivery=lambda err, msg: failed.append(err))
    wait_until(lambda: p.poll(0.05) is not None and bool(proxy.held), 20, "the Produce to be held")
    wait_until(lambda: p.poll(0.1) is not None and bool(failed), 30, "the held record to time out")
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(other, b"committed")
    p.commit_transaction(30)
    proxy.release()
    wait_until(lambda: bool(proxy.late_answers), 30, "the late Produce to be answered")
    return proxy, broker, topic


def test_a_late_produce_after_an_abort_is_refused_not_left_hanging(broker_factory):
    proxy, broker, topic = _late_write_after_abort(broker_factory, {})
    try:
        # librdkafka bumps its epoch after the timed-out request (KIP-360), so the coordinator answers
        # the old epoch PRODUCER_FENCED (INVALID_PRODUCER_EPOCH here); without a bump, the partition not
        # being in the transaction gives INVALID_TXN_STATE (Produce v10). Either way: refused.
        assert proxy.late_answers[0] in (INVALID_TXN_STATE, INVALID_PRODUCER_EPOCH), proxy.late_answers
        # Nothing of it is in the log beyond the abort marker, and the partition has no open transaction.
        stable, high = stable_and_high(broker, topic)
        assert stable == high
        assert read_values(broker.bootstrap, topic, 1, "read_committed") == []
        assert read_values(broker.bootstrap, topic, 1, "read_uncommitted") == []   # only the abort marker
        assert read_values(broker.bootstrap, "kip890-other", 1, "read_committed") == [b"committed"]
    finally:
        proxy.close()


def test_without_verification_the_same_late_produce_hangs(broker_factory):
    """The control case for the test above: the same sequence with verification off leaves a
    transaction open on the partition that no coordinator will end (the last stable offset stays)."""
    proxy, broker, topic = _late_write_after_abort(broker_factory,
                                                   {"transaction.partition.verification.enable": "false"})
    try:
        assert proxy.late_answers[0] == NONE, proxy.late_answers
        stable, high = stable_and_high(broker, topic)
        assert stable < high
        assert read_values(broker.bootstrap, topic, 1, "read_uncommitted") == [b"late"]
    finally:
        proxy.close()
