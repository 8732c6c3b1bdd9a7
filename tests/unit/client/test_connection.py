"""The sans-I/O client connection: framing, correlation ids, pipelining, ApiVersions negotiation."""

from __future__ import annotations

import struct

import pytest

from odradek.client.connection import (
    ClientConnection, HandshakeComplete, HandshakeError, NoCompatibleVersion, Response, State,
    client_versions, negotiate,
)
from odradek.protocol.api import decode_request, encode_response
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.framing import FrameReader, FrameTooLarge
from odradek.protocol.messages import api_versions as av, metadata as md

API_VERSIONS = 18


def frames_of(conn: ClientConnection) -> list[bytes]:
    """What the connection wrote, split into frames the way a broker reads them."""
    data = b"".join(bytes(c) for c in conn.data_to_send())
    return [bytes(f) for f in FrameReader(1 << 30).feed(data)]


def response_bytes(api_key: int, version: int, correlation_id: int, body) -> bytes:
    w = encode_response(api_key, version, correlation_id, body)
    return struct.pack(">i", len(w)) + bytes(w)


def broker_ranges(over: dict | None = None) -> list:
    ranges = {0: (0, 11), 1: (4, 13), 2: (1, 8), 3: (0, 12), 18: (0, 3), 22: (0, 4)}
    ranges.update(over or {})
    return [av.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in ranges.items()]


def ready_connection(**kwargs) -> ClientConnection:
    conn = ClientConnection("test-client", **kwargs)
    conn.start_handshake()
    [f] = frames_of(conn)
    header, _ = decode_request(f)
    events = conn.receive_data(response_bytes(
        API_VERSIONS, header.api_version, header.correlation_id,
        av.ApiVersionsResponse(error_code=0, api_keys=broker_ranges())))
    assert isinstance(events[0], HandshakeComplete)
    return conn


def test_handshake_negotiates_highest_common_version():
    conn = ClientConnection("cid", software_name="odradek-python", software_version="9.9")
    assert conn.state is State.NEW
    conn.start_handshake()
    [f] = frames_of(conn)
    header, body = decode_request(f)
    assert header.api_key == API_VERSIONS and header.client_id == "cid"
    assert header.api_version == client_versions()[API_VERSIONS][1]
    assert body.client_software_name == "odradek-python" and body.client_software_version == "9.9"
    [event] = conn.receive_data(response_bytes(
        API_VERSIONS, header.api_version, header.correlation_id,
        av.ApiVersionsResponse(error_code=0, api_keys=broker_ranges())))
    assert conn.state is State.READY
    assert event.versions[3] == 12              # broker max below ours
    assert event.versions[0] == 11              # Produce: broker 11, client up to 12
    assert event.versions[1] == 12              # Fetch: client caps at 12 (topic names)
    assert conn.version_for(18) == 3
    with pytest.raises(NoCompatibleVersion):
        conn.version_for(19)                    # the broker did not list CreateTopics


def test_unsupported_version_falls_back_to_the_brokers_api_versions_range():
    conn = ClientConnection("cid")
    conn.start_handshake()
    [f] = frames_of(conn)
    header, _ = decode_request(f)
    # A broker that only knows ApiVersions v0-v2 answers with a v0 body and UNSUPPORTED_VERSION.
    v0 = av.ApiVersionsResponse(error_code=35, api_keys=broker_ranges({18: (0, 2)}))
    assert conn.receive_data(response_bytes(API_VERSIONS, 0, header.correlation_id, v0)) == []
    [f2] = frames_of(conn)
    header2, _ = decode_request(f2)
    assert header2.api_key == API_VERSIONS and header2.api_version == 2
    assert header2.correlation_id != header.correlation_id
    [event] = conn.receive_data(response_bytes(
        API_VERSIONS, 2, header2.correlation_id, av.ApiVersionsResponse(error_code=0, api_keys=broker_ranges())))
    assert isinstance(event, HandshakeComplete) and conn.state is State.READY


def test_handshake_error_closes():
    conn = ClientConnection("cid")
    conn.start_handshake()
    [f] = frames_of(conn)
    header, _ = decode_request(f)
    with pytest.raises(HandshakeError):
        conn.receive_data(response_bytes(API_VERSIONS, header.api_version, header.correlation_id,
                                         av.ApiVersionsResponse(error_code=31)))
    assert conn.state is State.CLOSED


def test_pipelined_responses_match_in_order_even_split_across_reads():
    conn = ready_connection(max_in_flight_requests=3)
    tokens = ["a", "b", "c"]
    for t in tokens:
        conn.send_request(3, md.MetadataRequest(topics=None), token=t)
    assert conn.in_flight_count == 3 and not conn.can_send()
    with pytest.raises(ProtocolError):
        conn.send_request(3, md.MetadataRequest(topics=None), token="d")
    sent = frames_of(conn)
    headers = [decode_request(f)[0] for f in sent]
    assert [h.correlation_id for h in headers] == sorted(h.correlation_id for h in headers)
    assert all(h.api_version == 12 and h.client_id == "test-client" for h in headers)
    wire = b"".join(response_bytes(3, 12, h.correlation_id, md.MetadataResponse(cluster_id=f"c{i}"))
                    for i, h in enumerate(headers))
    events = []
    for i in range(0, len(wire), 7):            # arbitrary read boundaries
        events += conn.receive_data(wire[i:i + 7])
    assert [e.token for e in events] == tokens
    assert all(isinstance(e, Response) for e in events)
    assert [e.body.cluster_id for e in events] == ["c0", "c1", "c2"]
    assert conn.can_send()


def test_correlation_id_mismatch_is_fatal():
    conn = ready_connection()
    cid = conn.send_request(3, md.MetadataRequest(topics=None), token="x")
    frames_of(conn)
    with pytest.raises(ProtocolError):
        conn.receive_data(response_bytes(3, 12, cid + 1, md.MetadataResponse()))
    assert conn.state is State.CLOSED


def test_unsolicited_response_is_fatal():
    conn = ready_connection()
    with pytest.raises(ProtocolError):
        conn.receive_data(response_bytes(3, 12, 99, md.MetadataResponse()))


def test_requests_without_response_are_not_in_flight():
    from odradek.protocol.messages import produce as pm
    conn = ready_connection(max_in_flight_requests=1)
    conn.send_request(0, pm.ProduceRequest(acks=0, timeout_ms=100), expect_response=False)
    assert conn.in_flight_count == 0 and conn.can_send()
    [f] = frames_of(conn)
    header, body = decode_request(f)
    assert header.api_key == 0 and body.acks == 0


@pytest.mark.parametrize("size", [100, 16 * 1024 - 100, 16 * 1024 + 100, 1 << 20])
def test_large_record_batches_are_sent_from_the_producers_buffer(size):
    """A batch of at least ZERO_COPY_MIN_BYTES is one of the chunks to write (the producer's own
    buffer, not a copy); smaller ones are copied into the request. kafka-python's codec (an
    independent decoder) reads the same batch from the frame either way."""
    from kafka.protocol.producer import ProduceRequest as KPProduceRequest

    from odradek.protocol.codec import ZERO_COPY_MIN_BYTES
    from odradek.protocol.messages import produce as pm
    from odradek.records.builder import RecordBatchBuilder

    b = RecordBatchBuilder()
    value = bytes(range(256)) * 16
    while b.uncompressed_size < size:
        b.append(None, value[: max(1, min(4096, size - b.uncompressed_size - 16))], timestamp=1)
    batch = memoryview(b.build())
    conn = ready_connection()
    conn.send_request(0, pm.ProduceRequest(acks=1, timeout_ms=100, topic_data=[pm.TopicProduceData(
        name="t", partition_data=[pm.PartitionProduceData(index=0, records=batch)])]))
    chunks = conn.data_to_send()
    assert any(c is batch for c in chunks) == (len(batch) >= ZERO_COPY_MIN_BYTES)
    [f] = [bytes(x) for x in FrameReader(1 << 30).feed(b"".join(bytes(c) for c in chunks))]
    header, body = decode_request(f)
    assert bytes(body.topic_data[0].partition_data[0].records) == bytes(batch)
    theirs = KPProduceRequest.decode(f, version=header.api_version, header=True)
    assert bytes(theirs.topic_data[0].partition_data[0].records) == bytes(batch)


def test_close_returns_unanswered_tokens():
    conn = ready_connection()
    conn.send_request(3, md.MetadataRequest(topics=None), token=1)
    conn.send_request(3, md.MetadataRequest(topics=None), token=2)
    assert conn.close() == [1, 2]
    assert conn.state is State.CLOSED
    assert conn.receive_data(b"\x00\x00\x00\x04abcd") == []


def test_oversized_frame_is_rejected_before_allocation():
    conn = ready_connection(max_frame_bytes=1000)
    conn.send_request(3, md.MetadataRequest(topics=None))
    with pytest.raises(FrameTooLarge):
        conn.receive_data(struct.pack(">i", 1001))


def test_correlation_ids_wrap():
    conn = ready_connection()
    conn._next_correlation_id = 0x7FFFFFFF
    a = conn.send_request(3, md.MetadataRequest(topics=None))
    b = conn.send_request(3, md.MetadataRequest(topics=None))
    assert (a, b) == (0x7FFFFFFF, 0)


def test_negotiate():
    ours = {0: (3, 12), 1: (4, 12), 3: (0, 13)}
    theirs = {0: (0, 2), 1: (0, 17), 3: (5, 9), 50: (0, 1)}
    assert negotiate(ours, theirs) == {1: 12, 3: 9}
