"""Capture golden request frames from real Kafka clients (run by hand; the tests only read the files).

    python -m tests.protocol.capture                      # every client below
    python -m tests.protocol.capture --only kcat aiokafka # just these (their folders are rewritten)
    python -m tests.protocol.capture --list               # the client names

Needs confluent-kafka, kafka-python, aiokafka (the `test` extra) and Debian's `kcat` on PATH. The
clients (see PLANS): confluent-kafka (librdkafka 2.16: producers per codec, idempotent, transactional;
a classic group consumer; AdminClient), confluent-kafka-0.9 (librdkafka told the broker is 0.9),
confluent-kafka-kip848 (the KIP-848 consumer), kafka-python (newest; and pinned with api_version to
2.4, 2.1, 1.1, 0.11, 0.10, 0.9 for the versions in between), aiokafka, kcat (librdkafka 2.0.2).

For each client a fresh fake broker listens on 127.0.0.1 (an ephemeral port). It answers with canned
responses built with odradek's own encoders: ApiVersions advertising every version odradek declares
(as `odradek.server.apis.api_versions.supported` does), Metadata naming itself as the only broker and
the leader of every topic asked for (one partition unless CreateTopics said otherwise), Produce acks
that store the records, Fetch returning them (v2 batches from Fetch v4, magic 1 from v2, magic 0
below), ListOffsets, the classic group protocol, transactions, topic and config admin. Every request
frame it receives is recorded before it is decoded, so a frame odradek cannot parse is kept too.

The client itself runs in a child process (`--run CLIENT --bootstrap HOST:PORT`, killed after a
timeout): it produces N records to `golden-<client>-<label>` for each label (one per compression
codec, plus idempotent and transactional producers where the client has them), with key b"k<i>",
value b"<client>-<label>-<i>" and, where the format has headers, header ("n", b"<i>") (kcat: one
constant header, ("client", b"kcat")); then consumes `golden-<client>-none` in a group, and runs the
admin calls the client offers. It prints one JSON line: the labels it produced successfully, and
every step that failed.

Output, per client, under tests/protocol/golden/<client>/:

    <api>_v<version>_<n>.bin   one request frame, without its 4-byte size prefix
    index.json                 {"client", "frames": [{"file", "api_key", "api", "version"}],
                                "produced": {topic: {"label", "records": [[key, value, headers]]}}}

Frames identical but for their correlation id are stored once; at most MAX_PER_VERSION frames are
kept per API and version, those of a size not yet seen first, except Produce, whose frames are all
kept (tests/protocol/test_golden.py checks that they carry exactly the records listed under
"produced", in order). Keys, values and header values in index.json are latin-1 strings (the capture
writes ASCII only). A client step that fails, and anything odd the fake broker saw (a frame it could
not decode, an API it has no canned answer for), is printed: read the output before committing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

GOLDEN_DIR = Path(__file__).parent / "golden"
N = 10
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
MAX_PER_VERSION = 6
CLIENT_TIMEOUT_S = 240
HOST = "127.0.0.1"

# client -> [(label, headers mode)]; "index" = header ("n", b"<i>"), "kcat" = ("client", b"kcat").
PLANS = {
    "confluent-kafka": [(c, "index") for c in CODECS] + [("idempotent", "index"), ("txn", "index")],
    # librdkafka told the broker is 0.9 (api.version.request=false): message format 0, no ApiVersions.
    # (A 0.10 fallback is ignored by librdkafka 2.x: it sends ApiVersions and uses what it learns.)
    "confluent-kafka-0.9": [(c, "none") for c in CODECS[:4]],
    # librdkafka's KIP-848 consumer (ConsumerGroupHeartbeat), with one producer to feed it.
    "confluent-kafka-kip848": [("none", "index")],
    "kafka-python": [(c, "index") for c in CODECS] + [("idempotent", "index"), ("txn", "index")],
    # kafka-python pinned to older brokers (api_version=...): the versions in between.
    "kafka-python-2.4": [(c, "index") for c in CODECS],
    "kafka-python-2.1": [(c, "index") for c in CODECS],
    "kafka-python-1.1": [(c, "index") for c in CODECS[:4]],
    "kafka-python-0.11": [(c, "index") for c in CODECS[:4]],
    "kafka-python-0.10": [(c, "none") for c in CODECS[:4]],
    "kafka-python-0.9": [(c, "none") for c in CODECS[:4]],
    "aiokafka": [(c, "index") for c in CODECS] + [("idempotent", "index"), ("txn", "index")],
    "kcat": [(c, "kcat") for c in CODECS],
}
CLIENTS = tuple(PLANS)


def topic_for(client: str, label: str) -> str:
    return f"golden-{client}-{label}".replace(".", "_")


def group_for(client: str) -> str:
    return f"golden-{client}-group".replace(".", "_")


def records_for(client: str, label: str, headers: str) -> list[tuple[bytes, bytes, list]]:
    out = []
    for i in range(N):
        if headers == "index":
            hs = [("n", b"%d" % i)]
        elif headers == "kcat":
            hs = [("client", b"kcat")]
        else:
            hs = []
        out.append((b"k%d" % i, f"{client}-{label}-{i}".encode(), hs))
    return out


# =========================================================================================== broker

class Topic:
    def __init__(self, name: str, partitions: int = 1) -> None:
        self.name = name
        self.topic_id = uuid.uuid5(uuid.NAMESPACE_URL, "odradek-golden/" + name)
        self.partitions = partitions
        self.logs: dict[int, list] = {}

    def log(self, p: int) -> list:
        return self.logs.setdefault(p, [])


class FakeBroker:
    """One listening socket, a thread per connection, canned answers, every request frame recorded."""

    def __init__(self, kip848: bool = False) -> None:
        from odradek.protocol.extensions import EXTENSION_APIS
        from odradek.protocol.messages import APIS
        from odradek.server.apis.api_versions import supported

        self.sock = socket.create_server((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self.frames: list[bytes] = []
        self.notes: list[str] = []
        self.lock = threading.Lock()
        self.topics: dict[str, Topic] = {}
        self.groups: dict[str, dict] = {}
        self.next_member = 0
        self.next_pid = 1000
        self.conns: list[socket.socket] = []
        # Not advertised: inter-broker APIs, and KIP-848's (clients would then try the new protocol).
        hidden = {4, 5, 6, 7, 27, 69} | (set() if kip848 else {68}) | set(EXTENSION_APIS)
        self.api_versions = supported({k: None for k in APIS if k not in hidden})
        self.handlers = {
            0: self.produce, 1: self.fetch, 2: self.list_offsets, 3: self.metadata, 8: self.offset_commit,
            9: self.offset_fetch, 10: self.find_coordinator, 11: self.join_group, 12: self.heartbeat,
            13: self.leave_group, 14: self.sync_group, 15: self.describe_groups, 16: self.list_groups,
            18: self.api_versions_handler, 19: self.create_topics, 20: self.delete_topics,
            22: self.init_producer_id, 23: self.offset_for_leader_epoch, 24: self.add_partitions_to_txn,
            25: self.add_offsets_to_txn, 26: self.end_txn, 28: self.txn_offset_commit,
            32: self.describe_configs, 33: self.alter_configs, 37: self.create_partitions,
            42: self.delete_groups, 44: self.alter_configs, 60: self.describe_cluster,
            68: self.consumer_group_heartbeat, 75: self.describe_topic_partitions,
        }
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.sock.close()
        for c in list(self.conns):
            try:
                c.close()
            except OSError:
                pass

    def note(self, msg: str) -> None:
        with self.lock:
            self.notes.append(msg)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        from odradek.protocol.framing import FrameReader

        decoder = FrameReader(256 * 1024 * 1024)
        try:
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    return
                for frame in decoder.feed(data):
                    frame = bytes(frame)
                    with self.lock:
                        self.frames.append(frame)
                    response = self.answer(frame)
                    if response is False:
                        return
                    if response is not None:
                        conn.sendall(struct.pack(">i", len(response)) + response)
        except OSError:
            return
        except Exception:  # a bug in a canned answer: say so, drop the connection
            self.note("handler crashed:\n" + traceback.format_exc())
        finally:
            conn.close()

    def answer(self, frame: bytes):
        """The response bytes, None for no response, False to close the connection."""
        from odradek.protocol.api import APIS, decode_request, encode_response
        from odradek.protocol.exceptions import ProtocolError, UnsupportedVersionError
        from odradek.protocol.messages import api_versions as av

        try:
            header, request = decode_request(frame)
        except UnsupportedVersionError as e:
            if e.api_key == 18:
                body = av.ApiVersionsResponse(error_code=35, api_keys=[
                    av.ApiVersion(api_key=18, min_version=av.MIN_VERSION, max_version=av.MAX_VERSION)])
                return bytes(encode_response(18, 0, e.header.correlation_id, body))
            self.note(f"unsupported: {e}")
            return False
        except ProtocolError as e:
            self.note(f"DECODE FAILED api {frame[:2].hex()} v{frame[2:4].hex()}: {e}")
            return False
        handler = self.handlers.get(header.api_key)
        module = APIS[header.api_key]
        if handler is None:
            self.note(f"no canned answer for {module.NAME} v{header.api_version}: sent defaults")
            body = module.RESPONSE_CLASS()
        else:
            body = handler(header, request)
        if body is None:
            return None
        return bytes(encode_response(header.api_key, header.api_version, header.correlation_id, body))

    # ------------------------------------------------------------------------------------- helpers
    def topic(self, name: str, partitions: int = 1) -> Topic:
        with self.lock:
            t = self.topics.get(name)
            if t is None:
                t = self.topics[name] = Topic(name, partitions)
            return t

    def topic_by_id(self, topic_id) -> Topic | None:
        with self.lock:
            for t in self.topics.values():
                if t.topic_id == topic_id:
                    return t
        return None

    # ------------------------------------------------------------------------------------- APIs
    def api_versions_handler(self, h, req):
        from odradek.protocol.messages import api_versions as m
        return m.ApiVersionsResponse(error_code=0, api_keys=self.api_versions, throttle_time_ms=0)

    def metadata(self, h, req):
        from odradek.protocol.messages import metadata as m
        v = h.api_version
        if req.topics is None or (v == 0 and not req.topics):
            wanted = list(self.topics.values())
        else:
            wanted = []
            for t in req.topics:
                if t.name is None:
                    found = self.topic_by_id(t.topic_id)
                    wanted.append(found if found is not None else t.topic_id)
                else:
                    wanted.append(self.topic(t.name))
        out = []
        for t in wanted:
            if not isinstance(t, Topic):
                out.append(m.MetadataResponseTopic(error_code=100, name=None, topic_id=t))
                continue
            parts = [m.MetadataResponsePartition(
                error_code=0, partition_index=p, leader_id=0, leader_epoch=0, replica_nodes=[0],
                isr_nodes=[0], offline_replicas=[]) for p in range(t.partitions)]
            out.append(m.MetadataResponseTopic(error_code=0, name=t.name, topic_id=t.topic_id,
                                               is_internal=False, partitions=parts))
        return m.MetadataResponse(
            throttle_time_ms=0, brokers=[m.MetadataResponseBroker(node_id=0, host=HOST, port=self.port)],
            cluster_id="golden-cluster", controller_id=0, topics=out)

    def produce(self, h, req):
        from odradek.protocol.exceptions import ProtocolError
        from odradek.protocol.messages import produce as m
        from odradek.records import iter_records

        responses = []
        for td in req.topic_data:
            topic = self.topic(td.name) if h.api_version < 13 else self.topic_by_id(td.topic_id)
            parts = []
            for pd in td.partition_data:
                error, base = 0, -1
                try:
                    if pd.records is None:
                        raise ProtocolError("null records")
                    recs = [(r.key, r.value, list(r.headers), r.timestamp) for r in iter_records(pd.records)]
                    with self.lock:
                        log = topic.log(pd.index)
                        base = len(log)
                        log.extend(recs)
                except ProtocolError as e:
                    self.note(f"produce to {td.name}-{pd.index}: records do not decode: {e}")
                    error = 2  # CORRUPT_MESSAGE
                parts.append(m.PartitionProduceResponse(index=pd.index, error_code=error, base_offset=base,
                                                        log_append_time_ms=-1, log_start_offset=0))
            responses.append(m.TopicProduceResponse(name=td.name, topic_id=td.topic_id,
                                                    partition_responses=parts))
        if req.acks == 0:
            return None
        return m.ProduceResponse(responses=responses, throttle_time_ms=0)

    @staticmethod
    def _record_set(version: int, base: int, recs: list) -> bytes:
        from odradek.records import LegacyBuilder, RecordBatchBuilder
        if not recs:
            return b""
        if version >= 4:
            b = RecordBatchBuilder(base_offset=base)
            for key, value, headers, ts in recs:
                b.append(key, value, headers=headers, timestamp=ts)
        else:
            b = LegacyBuilder(1 if version >= 2 else 0, base_offset=base)
            for key, value, headers, ts in recs:
                b.append(key, value, timestamp=ts)
        return b.build()

    def fetch(self, h, req):
        from odradek.protocol.messages import fetch as m
        v = h.api_version
        out = []
        any_data = False
        for ft in req.topics:
            topic = self.topic(ft.topic) if v < 13 else self.topic_by_id(ft.topic_id)
            parts = []
            for fp in ft.partitions:
                with self.lock:
                    log = list(topic.log(fp.partition)) if topic else []
                hw = len(log)
                error, records = 0, b""
                if fp.fetch_offset < 0 or fp.fetch_offset > hw:
                    error = 1  # OFFSET_OUT_OF_RANGE
                else:
                    chunk = log[fp.fetch_offset:fp.fetch_offset + 100]
                    any_data = any_data or bool(chunk)
                    records = self._record_set(v, fp.fetch_offset, chunk)
                parts.append(m.PartitionData(
                    partition_index=fp.partition, error_code=error, high_watermark=hw, last_stable_offset=hw,
                    log_start_offset=0, aborted_transactions=[] if req.isolation_level else None,
                    records=records))
            out.append(m.FetchableTopicResponse(topic=ft.topic, topic_id=ft.topic_id, partitions=parts))
        if not any_data:
            time.sleep(min(max(req.max_wait_ms, 0), 200) / 1000)
        return m.FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=out)

    def list_offsets(self, h, req):
        from odradek.protocol.messages import list_offsets as m
        topics = []
        for t in req.topics:
            topic = self.topic(t.name)
            parts = []
            for p in t.partitions:
                hw = len(topic.log(p.partition_index))
                offset = 0 if p.timestamp == -2 else hw
                parts.append(m.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index, error_code=0, old_style_offsets=[offset],
                    timestamp=-1, offset=offset, leader_epoch=0))
            topics.append(m.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return m.ListOffsetsResponse(throttle_time_ms=0, topics=topics)

    def offset_for_leader_epoch(self, h, req):
        from odradek.protocol.messages import offset_for_leader_epoch as m
        topics = []
        for t in req.topics:
            topic = self.topic(t.topic)
            topics.append(m.OffsetForLeaderTopicResult(topic=t.topic, partitions=[
                m.EpochEndOffset(error_code=0, partition=p.partition, leader_epoch=0,
                                 end_offset=len(topic.log(p.partition))) for p in t.partitions]))
        return m.OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)

    def find_coordinator(self, h, req):
        from odradek.protocol.messages import find_coordinator as m
        keys = req.coordinator_keys if h.api_version >= 4 else [req.key]
        return m.FindCoordinatorResponse(
            throttle_time_ms=0, error_code=0, error_message=None, node_id=0, host=HOST, port=self.port,
            coordinators=[m.Coordinator(key=k, node_id=0, host=HOST, port=self.port, error_code=0,
                                        error_message=None) for k in keys])

    def join_group(self, h, req):
        from odradek.protocol.messages import join_group as m
        with self.lock:
            g = self.groups.setdefault(req.group_id, {"generation": 0, "members": {}, "assignments": {},
                                                      "protocol": None, "client_id": h.client_id})
            if not req.member_id and h.api_version >= 4:
                self.next_member += 1
                member = f"{h.client_id}-{self.next_member}"
                return m.JoinGroupResponse(error_code=79, generation_id=-1, leader="",
                                           protocol_name=None if h.api_version >= 7 else "",
                                           member_id=member, members=[])  # MEMBER_ID_REQUIRED
            member = req.member_id
            if not member:
                self.next_member += 1
                member = f"{h.client_id}-{self.next_member}"
            proto = req.protocols[0]
            g["generation"] += 1
            g["protocol"] = proto.name
            g["protocol_type"] = req.protocol_type
            g["members"] = {member: proto.metadata}
            return m.JoinGroupResponse(
                throttle_time_ms=0, error_code=0, generation_id=g["generation"],
                protocol_type=req.protocol_type, protocol_name=proto.name, leader=member, member_id=member,
                members=[m.JoinGroupResponseMember(member_id=member, group_instance_id=req.group_instance_id,
                                                   metadata=proto.metadata)])

    def consumer_group_heartbeat(self, h, req):
        from odradek.protocol.messages import consumer_group_heartbeat as m
        member = req.member_id or str(uuid.uuid4())
        if req.member_epoch < 0:  # leaving
            return m.ConsumerGroupHeartbeatResponse(error_code=0, member_id=member, member_epoch=req.member_epoch,
                                                    heartbeat_interval_ms=500)
        assignment = None
        if req.member_epoch == 0 or req.subscribed_topic_names is not None:
            assignment = m.Assignment(topic_partitions=[
                m.TopicPartitions(topic_id=t.topic_id, partitions=list(range(t.partitions)))
                for t in (self.topic(n) for n in (req.subscribed_topic_names or []))])
        return m.ConsumerGroupHeartbeatResponse(
            throttle_time_ms=0, error_code=0, member_id=member, member_epoch=max(req.member_epoch, 1),
            heartbeat_interval_ms=500, assignment=assignment)

    def sync_group(self, h, req):
        from odradek.protocol.messages import sync_group as m
        with self.lock:
            g = self.groups.get(req.group_id, {"assignments": {}, "protocol": None, "protocol_type": None})
            for a in req.assignments:
                g["assignments"][a.member_id] = a.assignment
            return m.SyncGroupResponse(
                throttle_time_ms=0, error_code=0, protocol_type=g.get("protocol_type"),
                protocol_name=g.get("protocol"), assignment=g["assignments"].get(req.member_id, b""))

    def heartbeat(self, h, req):
        from odradek.protocol.messages import heartbeat as m
        return m.HeartbeatResponse(throttle_time_ms=0, error_code=0)

    def leave_group(self, h, req):
        from odradek.protocol.messages import leave_group as m
        with self.lock:
            g = self.groups.get(req.group_id)
            if g is not None:
                g["members"] = {}
        return m.LeaveGroupResponse(throttle_time_ms=0, error_code=0, members=[
            m.MemberResponse(member_id=x.member_id, group_instance_id=x.group_instance_id, error_code=0)
            for x in req.members])

    def offset_commit(self, h, req):
        from odradek.protocol.messages import offset_commit as m
        return m.OffsetCommitResponse(throttle_time_ms=0, topics=[
            m.OffsetCommitResponseTopic(name=t.name, topic_id=t.topic_id, partitions=[
                m.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=0)
                for p in t.partitions]) for t in req.topics])

    def offset_fetch(self, h, req):
        from odradek.protocol.messages import offset_fetch as m
        topics = [m.OffsetFetchResponseTopic(name=t.name, partitions=[
            m.OffsetFetchResponsePartition(partition_index=p, committed_offset=-1, committed_leader_epoch=-1,
                                           metadata="", error_code=0) for p in t.partition_indexes])
            for t in (req.topics or [])]
        groups = [m.OffsetFetchResponseGroup(group_id=g.group_id, error_code=0, topics=[
            m.OffsetFetchResponseTopics(name=t.name, topic_id=t.topic_id, partitions=[
                m.OffsetFetchResponsePartitions(partition_index=p, committed_offset=-1,
                                                committed_leader_epoch=-1, metadata="", error_code=0)
                for p in t.partition_indexes]) for t in (g.topics or [])]) for g in req.groups]
        return m.OffsetFetchResponse(throttle_time_ms=0, topics=topics, error_code=0, groups=groups)

    def describe_groups(self, h, req):
        from odradek.protocol.messages import describe_groups as m
        out = []
        for gid in req.groups:
            g = self.groups.get(gid)
            if g is None:
                out.append(m.DescribedGroup(error_code=0, group_id=gid, group_state="Dead", protocol_type="",
                                            protocol_data="", members=[]))
                continue
            members = [m.DescribedGroupMember(
                member_id=mid, client_id=g["client_id"] or "", client_host="/127.0.0.1", member_metadata=md,
                member_assignment=g["assignments"].get(mid, b"")) for mid, md in g["members"].items()]
            out.append(m.DescribedGroup(
                error_code=0, group_id=gid, group_state="Stable" if members else "Empty",
                protocol_type=g.get("protocol_type") or "consumer", protocol_data=g["protocol"] or "",
                members=members))
        return m.DescribeGroupsResponse(throttle_time_ms=0, groups=out)

    def list_groups(self, h, req):
        from odradek.protocol.messages import list_groups as m
        return m.ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=[
            m.ListedGroup(group_id=gid, protocol_type=g.get("protocol_type") or "consumer",
                          group_state="Stable" if g["members"] else "Empty", group_type="classic")
            for gid, g in self.groups.items()])

    def delete_groups(self, h, req):
        from odradek.protocol.messages import delete_groups as m
        return m.DeleteGroupsResponse(throttle_time_ms=0, results=[
            m.DeletableGroupResult(group_id=g, error_code=0) for g in req.groups_names])

    def create_topics(self, h, req):
        from odradek.protocol.messages import create_topics as m
        out = []
        for t in req.topics:
            n = t.num_partitions if t.num_partitions > 0 else max(len(t.assignments), 1)
            topic = self.topic(t.name, n)
            out.append(m.CreatableTopicResult(
                name=t.name, topic_id=topic.topic_id, error_code=0, error_message=None, num_partitions=n,
                replication_factor=1, configs=[]))
        return m.CreateTopicsResponse(throttle_time_ms=0, topics=out)

    def delete_topics(self, h, req):
        from odradek.protocol.messages import delete_topics as m
        if h.api_version >= 6:
            wanted = [(t.name, t.topic_id) for t in req.topics]
        else:
            wanted = [(n, None) for n in req.topic_names]
        out = []
        for name, topic_id in wanted:
            topic = self.topics.get(name) if name is not None else self.topic_by_id(topic_id)
            if topic is not None:
                with self.lock:
                    self.topics.pop(topic.name, None)
            out.append(m.DeletableTopicResult(
                name=topic.name if topic else name, topic_id=topic.topic_id if topic else topic_id,
                error_code=0 if topic else 3, error_message=None))
        return m.DeleteTopicsResponse(throttle_time_ms=0, responses=out)

    def create_partitions(self, h, req):
        from odradek.protocol.messages import create_partitions as m
        for t in req.topics:
            self.topic(t.name).partitions = t.count
        return m.CreatePartitionsResponse(throttle_time_ms=0, results=[
            m.CreatePartitionsTopicResult(name=t.name, error_code=0) for t in req.topics])

    def describe_configs(self, h, req):
        from odradek.protocol.messages import describe_configs as m
        canned = {2: [("cleanup.policy", "delete"), ("retention.ms", "604800000")],
                  4: [("num.partitions", "1"), ("log.retention.hours", "168")]}
        out = []
        for r in req.resources:
            configs = [m.DescribeConfigsResourceResult(
                name=k, value=val, read_only=False, config_source=5, is_default=True, is_sensitive=False,
                synonyms=[], config_type=2, documentation=None)
                for k, val in canned.get(r.resource_type, [])
                if r.configuration_keys is None or k in r.configuration_keys]
            out.append(m.DescribeConfigsResult(error_code=0, error_message=None, resource_type=r.resource_type,
                                               resource_name=r.resource_name, configs=configs))
        return m.DescribeConfigsResponse(throttle_time_ms=0, results=out)

    def alter_configs(self, h, req):
        from odradek.protocol.api import APIS
        m = APIS[h.api_key]
        return m.RESPONSE_CLASS(throttle_time_ms=0, responses=[
            m.AlterConfigsResourceResponse(error_code=0, error_message=None, resource_type=r.resource_type,
                                           resource_name=r.resource_name) for r in req.resources])

    def describe_cluster(self, h, req):
        from odradek.protocol.messages import describe_cluster as m
        return m.DescribeClusterResponse(
            throttle_time_ms=0, error_code=0, endpoint_type=req.endpoint_type, cluster_id="golden-cluster",
            controller_id=0, brokers=[m.DescribeClusterBroker(broker_id=0, host=HOST, port=self.port)])

    def describe_topic_partitions(self, h, req):
        from odradek.protocol.messages import describe_topic_partitions as m
        out = []
        for t in req.topics:
            topic = self.topic(t.name)
            out.append(m.DescribeTopicPartitionsResponseTopic(
                error_code=0, name=t.name, topic_id=topic.topic_id, is_internal=False, partitions=[
                    m.DescribeTopicPartitionsResponsePartition(
                        error_code=0, partition_index=p, leader_id=0, leader_epoch=0, replica_nodes=[0],
                        isr_nodes=[0], offline_replicas=[]) for p in range(topic.partitions)]))
        return m.DescribeTopicPartitionsResponse(throttle_time_ms=0, topics=out)

    def init_producer_id(self, h, req):
        from odradek.protocol.messages import init_producer_id as m
        with self.lock:
            self.next_pid += 1
            pid = self.next_pid
        return m.InitProducerIdResponse(throttle_time_ms=0, error_code=0, producer_id=pid, producer_epoch=0)

    def add_partitions_to_txn(self, h, req):
        from odradek.protocol.messages import add_partitions_to_txn as m

        def results(topics):
            return [m.AddPartitionsToTxnTopicResult(name=t.name, results_by_partition=[
                m.AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=0)
                for p in t.partitions]) for t in topics]
        return m.AddPartitionsToTxnResponse(
            throttle_time_ms=0, error_code=0,
            results_by_transaction=[m.AddPartitionsToTxnResult(transactional_id=x.transactional_id,
                                                               topic_results=results(x.topics))
                                    for x in req.transactions],
            results_by_topic_v3_and_below=results(req.v3_and_below_topics))

    def add_offsets_to_txn(self, h, req):
        from odradek.protocol.messages import add_offsets_to_txn as m
        return m.AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=0)

    def end_txn(self, h, req):
        from odradek.protocol.messages import end_txn as m
        return m.EndTxnResponse(throttle_time_ms=0, error_code=0, producer_id=req.producer_id,
                                producer_epoch=req.producer_epoch)

    def txn_offset_commit(self, h, req):
        from odradek.protocol.messages import txn_offset_commit as m
        return m.TxnOffsetCommitResponse(throttle_time_ms=0, topics=[
            m.TxnOffsetCommitResponseTopic(name=t.name, partitions=[
                m.TxnOffsetCommitResponsePartition(partition_index=p.partition_index, error_code=0)
                for p in t.partitions]) for t in req.topics])


# =========================================================================================== clients
# Each runs in the child process and returns (labels produced, failed steps).

class Steps:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.produced: list[str] = []

    def run(self, name: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a client step failing is reported, not fatal
            self.failed.append(f"{name}: {type(e).__name__}: {e}"[:400])
            return None

    def check_consumed(self, client: str, got: list[bytes]) -> None:
        want = [r[1] for r in records_for(client, "none", "none")]
        if got != want:
            raise AssertionError(f"consumed {got!r}, expected {want!r}")


def run_confluent(bootstrap: str, steps: Steps) -> None:
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicCollection, TopicPartition
    from confluent_kafka.admin import (
        AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic, OffsetSpec,
    )

    client = "confluent-kafka"
    common = {"bootstrap.servers": bootstrap, "client.id": "golden-confluent", "broker.address.family": "v4"}

    def produce(label, headers, extra):
        p = Producer({**common, "linger.ms": 50, **extra})
        if "transactional.id" in extra:
            p.init_transactions(30)
            p.begin_transaction()
        errors = []
        for key, value, hs in records_for(client, label, headers):
            p.produce(topic_for(client, label), key=key, value=value, headers=hs,
                      on_delivery=lambda err, msg: err and errors.append(err))
        if "transactional.id" in extra:
            p.commit_transaction(30)
        if p.flush(30) or errors:
            raise RuntimeError(f"not delivered: {errors}")
        steps.produced.append(label)

    for label, headers in PLANS[client]:
        extra = {"compression.type": label} if label in CODECS else {}
        if label == "idempotent":
            extra = {"enable.idempotence": True}
        if label == "txn":
            extra = {"transactional.id": "golden-confluent-txn"}
        steps.run(f"produce {label}", produce, label, headers, extra)

    def consume():
        c = Consumer({**common, "group.id": group_for(client), "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 100, "session.timeout.ms": 10000})
        c.subscribe([topic_for(client, "none")])
        got = []
        deadline = time.time() + 60
        while len(got) < N and time.time() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
        c.commit(asynchronous=False)
        c.close()
        steps.check_consumed(client, got)
    steps.run("consume", consume)

    a = AdminClient(common)
    name = "golden-confluent-admin"

    def wait(futures):
        return {k: f.result(timeout=20) for k, f in futures.items()}
    steps.run("create_topics", wait, a.create_topics(
        [NewTopic(name, num_partitions=3, replication_factor=1, config={"cleanup.policy": "compact"})],
        operation_timeout=10))
    steps.run("list_topics", a.list_topics, timeout=10)
    steps.run("describe_configs", wait, a.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, name), ConfigResource(ConfigResource.Type.BROKER, "0")]))
    steps.run("incremental_alter_configs", wait, a.incremental_alter_configs([ConfigResource(
        ConfigResource.Type.TOPIC, name, incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])]))
    steps.run("create_partitions", wait, a.create_partitions([NewPartitions(name, 4)]))
    steps.run("describe_topics", wait, a.describe_topics(TopicCollection([name])))
    steps.run("describe_cluster", lambda: a.describe_cluster().result(timeout=20))
    steps.run("list_consumer_groups", lambda: a.list_consumer_groups().result(timeout=20))
    steps.run("describe_consumer_groups", wait, a.describe_consumer_groups([group_for(client)]))
    steps.run("list_consumer_group_offsets", wait, a.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group_for(client))]))
    steps.run("list_offsets", wait, a.list_offsets({TopicPartition(topic_for(client, "none"), 0):
                                                    OffsetSpec.latest()}))
    steps.run("delete_consumer_groups", wait, a.delete_consumer_groups([group_for(client)]))
    steps.run("delete_topics", wait, a.delete_topics([name], operation_timeout=10))


def run_confluent_legacy(bootstrap: str, steps: Steps, client: str, broker_version: str) -> None:
    from confluent_kafka import Consumer, Producer

    common = {"bootstrap.servers": bootstrap, "client.id": "golden-" + client, "broker.address.family": "v4",
              "api.version.request": False, "broker.version.fallback": broker_version}

    def produce(label, headers):
        p = Producer({**common, "linger.ms": 50, "compression.type": label})
        errors = []
        for key, value, hs in records_for(client, label, headers):
            p.produce(topic_for(client, label), key=key, value=value,
                      on_delivery=lambda err, msg: err and errors.append(err))
        if p.flush(30) or errors:
            raise RuntimeError(f"not delivered: {errors}")
        steps.produced.append(label)

    for label, headers in PLANS[client]:
        steps.run(f"produce {label}", produce, label, headers)

    def consume():
        c = Consumer({**common, "group.id": group_for(client), "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 100, "session.timeout.ms": 10000})
        c.subscribe([topic_for(client, "none")])
        got = []
        deadline = time.time() + 60
        while len(got) < N and time.time() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
        c.commit(asynchronous=False)
        c.close()
        steps.check_consumed(client, got)
    steps.run("consume", consume)


def run_confluent_kip848(bootstrap: str, steps: Steps) -> None:
    from confluent_kafka import Consumer, Producer

    client = "confluent-kafka-kip848"
    common = {"bootstrap.servers": bootstrap, "client.id": "golden-kip848", "broker.address.family": "v4"}

    def produce(label, headers):
        p = Producer({**common, "linger.ms": 50})
        for key, value, hs in records_for(client, label, headers):
            p.produce(topic_for(client, label), key=key, value=value, headers=hs)
        if p.flush(30):
            raise RuntimeError("not delivered")
        steps.produced.append(label)
    steps.run("produce none", produce, "none", "index")

    def consume():
        c = Consumer({**common, "group.id": group_for(client), "group.protocol": "consumer",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        c.subscribe([topic_for(client, "none")])
        got = []
        deadline = time.time() + 60
        while len(got) < N and time.time() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.value())
        c.commit(asynchronous=False)
        c.close()
        steps.check_consumed(client, got)
    steps.run("consume", consume)


def run_kafka_python(bootstrap: str, steps: Steps, client: str = "kafka-python", api_version=None) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    old = api_version is not None
    kw = {"bootstrap_servers": bootstrap, "client_id": "golden-" + client}
    if old:
        kw["api_version"] = api_version

    def produce(label, headers):
        extra = {}
        if label in CODECS and label != "none":
            extra["compression_type"] = label
        if label == "idempotent":
            extra["enable_idempotence"] = True
        if label == "txn":
            extra["transactional_id"] = f"golden-{client}-txn"
        p = KafkaProducer(linger_ms=50, **kw, **extra)
        if label == "txn":
            p.init_transactions()
            p.begin_transaction()
        futures = [p.send(topic_for(client, label), key=key, value=value, **({"headers": hs} if hs else {}))
                   for key, value, hs in records_for(client, label, headers)]
        if label == "txn":
            p.commit_transaction()
        p.flush(30)
        for f in futures:
            f.get(timeout=30)
        p.close(10)
        steps.produced.append(label)

    for label, headers in PLANS[client]:
        steps.run(f"produce {label}", produce, label, headers)

    def consume():
        c = KafkaConsumer(topic_for(client, "none"), group_id=group_for(client), auto_offset_reset="earliest",
                          enable_auto_commit=False, consumer_timeout_ms=30000, fetch_max_wait_ms=100, **kw)
        got = []
        for msg in c:
            got.append(msg.value)
            if len(got) >= N:
                break
        c.commit()
        c.close()
        steps.check_consumed(client, got)
    steps.run("consume", consume)
    if old and api_version < (1, 0):
        return

    from kafka.admin import (
        ACLFilter, ACLOperation, ACLPermissionType, ConfigResource, ConfigResourceType, KafkaAdminClient,
        NewPartitions, NewTopic, ResourcePatternFilter, ResourceType, ACLResourcePatternType,
    )
    from kafka.structs import TopicPartition
    a = steps.run("admin client", KafkaAdminClient, request_timeout_ms=15000, **kw)
    if a is None:
        return
    name = topic_for(client, "admin")
    steps.run("create_topics", a.create_topics, [NewTopic(name, 3, 1, topic_configs={"cleanup.policy": "compact"})])
    steps.run("list_topics", a.list_topics)
    steps.run("describe_topics", a.describe_topics, [name])
    steps.run("describe_topic_partitions", a.describe_topic_partitions, [name])
    steps.run("describe_configs", a.describe_configs, [ConfigResource(ConfigResourceType.TOPIC, name),
                                                       ConfigResource(ConfigResourceType.BROKER, "0")])
    steps.run("alter_configs", a.alter_configs,
              [ConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": "1000"})])
    steps.run("create_partitions", a.create_partitions, {name: NewPartitions(4)})
    steps.run("describe_cluster", a.describe_cluster)
    steps.run("list_groups", a.list_groups)
    steps.run("describe_groups", a.describe_groups, [group_for(client)])
    steps.run("list_group_offsets", a.list_group_offsets, {group_for(client): None})
    steps.run("list_partition_offsets", a.list_partition_offsets,
              {TopicPartition(topic_for(client, "none"), 0): -1})
    steps.run("delete_records", a.delete_records, {TopicPartition(topic_for(client, "none"), 0): 1})
    steps.run("describe_log_dirs", a.describe_log_dirs)
    steps.run("describe_acls", a.describe_acls, ACLFilter(
        principal=None, host="*", operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
        resource_pattern=ResourcePatternFilter(ResourceType.TOPIC, name, ACLResourcePatternType.LITERAL)))
    steps.run("list_transactions", a.list_transactions)
    steps.run("describe_producers", a.describe_producers, [TopicPartition(topic_for(client, "none"), 0)])
    steps.run("describe_transactions", a.describe_transactions, [f"golden-{client}-txn"])
    steps.run("delete_groups", a.delete_groups, [group_for(client)])
    steps.run("delete_topics", a.delete_topics, [name])
    a.close()


def run_aiokafka(bootstrap: str, steps: Steps) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    client = "aiokafka"

    async def produce(label, headers):
        extra = {}
        if label in CODECS and label != "none":
            extra["compression_type"] = label
        if label == "idempotent":
            extra["enable_idempotence"] = True
        if label == "txn":
            extra["transactional_id"] = "golden-aiokafka-txn"
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="golden-aiokafka", linger_ms=50, **extra)
        await p.start()
        try:
            if label == "txn":
                await p.begin_transaction()
            futures = [await p.send(topic_for(client, label), key=key, value=value, headers=hs)
                       for key, value, hs in records_for(client, label, headers)]
            if label == "txn":
                await p.commit_transaction()
            for f in futures:
                await asyncio.wait_for(f, 30)
        finally:
            await p.stop()
        steps.produced.append(label)

    async def consume():
        c = AIOKafkaConsumer(topic_for(client, "none"), bootstrap_servers=bootstrap, client_id="golden-aiokafka",
                             group_id=group_for(client), auto_offset_reset="earliest", enable_auto_commit=False,
                             fetch_max_wait_ms=100)
        await c.start()
        try:
            got = []
            while len(got) < N:
                msg = await asyncio.wait_for(c.getone(), 30)
                got.append(msg.value)
            await c.commit()
        finally:
            await c.stop()
        steps.check_consumed(client, got)

    async def admin():
        a = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="golden-aiokafka", request_timeout_ms=15000)
        await a.start()
        name = "golden-aiokafka-admin"
        try:
            for step, coro in [
                ("create_topics", lambda: a.create_topics([NewTopic(name, 3, 1)])),
                ("list_topics", lambda: a.list_topics()),
                ("describe_topics", lambda: a.describe_topics([name])),
                ("describe_configs", lambda: a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])),
                ("create_partitions", lambda: a.create_partitions({name: NewPartitions(4)})),
                ("describe_cluster", lambda: a.describe_cluster()),
                ("list_consumer_groups", lambda: a.list_consumer_groups()),
                ("describe_consumer_groups", lambda: a.describe_consumer_groups([group_for(client)])),
                ("list_consumer_group_offsets", lambda: a.list_consumer_group_offsets(group_for(client))),
                ("delete_topics", lambda: a.delete_topics([name])),
            ]:
                try:
                    await asyncio.wait_for(coro(), 30)
                except Exception as e:  # noqa: BLE001
                    steps.failed.append(f"{step}: {type(e).__name__}: {e}"[:400])
        finally:
            await a.close()

    async def main():
        for label, headers in PLANS[client]:
            try:
                await produce(label, headers)
            except Exception as e:  # noqa: BLE001
                steps.failed.append(f"produce {label}: {type(e).__name__}: {e}"[:400])
        try:
            await consume()
        except Exception as e:  # noqa: BLE001
            steps.failed.append(f"consume: {type(e).__name__}: {e}"[:400])
        await admin()

    asyncio.run(main())


def run_kcat(bootstrap: str, steps: Steps) -> None:
    client = "kcat"
    base = ["kcat", "-b", bootstrap, "-X", "broker.address.family=v4"]

    def kcat(args, stdin=None):
        r = subprocess.run(base + args, input=stdin, capture_output=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"kcat {' '.join(args)} exited {r.returncode}: {r.stderr.decode()[-300:]}")
        return r.stdout

    steps.run("-L", kcat, ["-L"])
    for label, headers in PLANS[client]:
        lines = b"".join(key + b":" + value + b"\n" for key, value, _ in records_for(client, label, headers))

        def produce(label=label, lines=lines):
            kcat(["-P", "-t", topic_for(client, label), "-K", ":", "-z", label, "-H", "client=kcat",
                  "-X", "linger.ms=50"], lines)
            steps.produced.append(label)
        steps.run(f"-P {label}", produce)

    def consume():
        out = kcat(["-C", "-t", topic_for(client, "none"), "-o", "beginning", "-e", "-c", str(N), "-f", "%s\n"])
        steps.check_consumed(client, out.splitlines())
    steps.run("-C", consume)

    def consume_group():
        out = kcat(["-G", group_for(client), "-o", "beginning", "-e", "-c", str(N), "-f", "%s\n",
                    "-X", "fetch.wait.max.ms=100", topic_for(client, "none")])
        steps.check_consumed(client, out.splitlines())
    steps.run("-G", consume_group)
    steps.run("-L -J", kcat, ["-L", "-J", "-t", topic_for(client, "none")])


def run_client(client: str, bootstrap: str) -> dict:
    steps = Steps()
    if client == "confluent-kafka":
        run_confluent(bootstrap, steps)
    elif client == "kafka-python":
        run_kafka_python(bootstrap, steps)
    elif client.startswith("kafka-python-"):
        run_kafka_python(bootstrap, steps, client, tuple(int(x) for x in client.split("-")[-1].split(".")))
    elif client.startswith("confluent-kafka-0."):
        run_confluent_legacy(bootstrap, steps, client, client.split("-")[-1] + ".0")
    elif client == "confluent-kafka-kip848":
        run_confluent_kip848(bootstrap, steps)
    elif client == "aiokafka":
        run_aiokafka(bootstrap, steps)
    elif client == "kcat":
        run_kcat(bootstrap, steps)
    else:
        raise SystemExit(f"unknown client {client}")
    return {"produced": steps.produced, "failed": steps.failed}


# =========================================================================================== storing

def select_frames(frames: list[bytes]) -> list[bytes]:
    """Drop frames identical but for the correlation id; cap how many are kept per API and version.

    Frames of a size not yet seen for their API and version are kept first (a different size usually
    means a different shape: a null list, another topic, an extra field), up to MAX_PER_VERSION; then
    the rest, in order, fill what is left of the cap. Produce frames are all kept. Order is preserved.
    """
    seen = set()
    unique = []
    for f in frames:
        masked = f[:4] + b"\0\0\0\0" + f[8:]
        if masked not in seen:
            seen.add(masked)
            unique.append(f)
    keep = set()
    count: dict[tuple[int, int], int] = {}
    sizes: set[tuple[int, int, int]] = set()
    for first_pass in (True, False):
        for i, f in enumerate(unique):
            key = struct.unpack_from(">hh", f, 0)
            if i in keep or (first_pass and (*key, len(f)) in sizes):
                continue
            if key[0] != 0 and count.get(key, 0) >= MAX_PER_VERSION:
                continue
            keep.add(i)
            sizes.add((*key, len(f)))
            count[key] = count.get(key, 0) + 1
    return [f for i, f in enumerate(unique) if i in keep]


def store(client: str, frames: list[bytes], produced: list[str]) -> dict:
    from odradek.protocol.messages import APIS

    folder = GOLDEN_DIR / client
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    entries = []
    counters: dict[tuple[str, int], int] = {}
    for f in select_frames(frames):
        api_key, version = struct.unpack_from(">hh", f, 0)
        module = APIS.get(api_key)
        api = module.__name__.rsplit(".", 1)[-1] if module else f"api{api_key}"
        n = counters.get((api, version), 0)
        counters[(api, version)] = n + 1
        name = f"{api}_v{version}_{n}.bin"
        (folder / name).write_bytes(f)
        entries.append({"file": name, "api_key": api_key, "api": module.NAME if module else None,
                        "version": version})
    plan = dict(PLANS[client])
    index = {
        "client": client,
        "frames": entries,
        "produced": {
            topic_for(client, label): {
                "label": label,
                "records": [[k.decode("latin-1"), v.decode("latin-1"),
                             [[hk, hv.decode("latin-1")] for hk, hv in hs]]
                            for k, v, hs in records_for(client, label, plan[label])],
            } for label in produced
        },
    }
    (folder / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


def capture(client: str) -> dict:
    broker = FakeBroker(kip848=client.endswith("kip848"))
    bootstrap = f"{HOST}:{broker.port}"
    print(f"== {client} against {bootstrap}", flush=True)
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, "-m", "tests.protocol.capture", "--run", client,
                            "--bootstrap", bootstrap], capture_output=True, timeout=CLIENT_TIMEOUT_S,
                           cwd=Path(__file__).parents[2], env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines = r.stdout.decode().strip().splitlines()
        result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {
            "produced": [], "failed": [f"client exited {r.returncode}: {r.stderr.decode()[-2000:]}"]}
    except subprocess.TimeoutExpired as e:
        result = {"produced": [], "failed": [f"client timed out: {(e.stderr or b'').decode()[-2000:]}"]}
    time.sleep(0.2)
    broker.close()
    with broker.lock:
        frames = list(broker.frames)
    index = store(client, frames, result["produced"])
    print(f"   {len(frames)} frames received, {len(index['frames'])} stored, "
          f"{time.time() - t0:.1f}s; produced {result['produced']}")
    for f in result["failed"]:
        print("   client step failed:", f)
    for n in broker.notes:
        print("   broker:", n)
    return index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=CLIENTS, help="capture only these clients")
    ap.add_argument("--list", action="store_true", help="print the client names")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(CLIENTS))
        return 0
    if args.run:
        print(json.dumps(run_client(args.run, args.bootstrap)), flush=True)
        return 0
    if shutil.which("kcat") is None and (not args.only or "kcat" in args.only):
        print("kcat is not on PATH (apt-get install kcat)", file=sys.stderr)
        return 1
    for client in args.only or CLIENTS:
        capture(client)
    total = sum(p.stat().st_size for p in GOLDEN_DIR.rglob("*") if p.is_file())
    print(f"golden set: {total / 1024:.0f} KiB under {GOLDEN_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
