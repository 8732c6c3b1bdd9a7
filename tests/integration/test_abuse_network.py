"""The abuse suite, network and decoding rows (hardening issue, "What it must contain" 1): inputs that
are small on the wire but used to make the broker allocate or work without bound. For each: the broker
answers or closes that connection, stays alive, an unrelated client keeps being answered, RSS grows by at
most 8x the bytes sent + 64 MiB, and well-formed records produced before and after are read back by
confluent-kafka, kafka-python and aiokafka.

Rows: connections announcing 100 MB requests and sending 55 bytes (`queued.max.request.bytes` as one
broker-wide pool, no allocation of an announced size); a million pipelined ApiVersions never read back
(one request in flight per connection: the rest stay in the kernel); Metadata v1 naming millions of empty
topic names and a request header of millions of empty tagged fields (the decode budget); a sender of one
byte at a time (`socket.request.receive.timeout.ms`)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from odradek.records.varint import encode_uvarint as uvarint

from .abuse_support import assert_all_read_back, assert_rss_bounded, pinging, three_client_round_trip
from .clients import api_versions_ok, api_versions_v0, closed_by_peer, connect, request_frame, wait_until

POOL_BYTES = 100 * 1024 * 1024
BROKER_OVERRIDES = {"queued.max.request.bytes": POOL_BYTES, "auto.create.topics.enable": "true"}


@pytest.fixture(scope="module")
def before(broker):
    """Records written before any abuse; every test checks they are still read back afterwards."""
    topic = "abuse-network"
    return topic, three_client_round_trip(broker.bootstrap, topic, "before")


def after_abuse(broker, before, tag: str) -> None:
    topic, values = before
    assert broker.running, "the broker died"
    values += three_client_round_trip(broker.bootstrap, topic, tag)
    assert_all_read_back(broker.bootstrap, topic, values)


def test_announced_sizes_are_not_allocated(broker, before):
    """8 connections each announce a 100 MB request (socket.request.max.bytes allows it) and send 55
    bytes. Memory follows what arrived: the first gets the pool's grant and a buffer that grows with its
    bytes, the others wait for the pool without allocating."""
    rss0 = broker.rss_kb()
    socks = []
    with pinging(broker) as pinger:
        for i in range(8):
            s = connect(broker.host, broker.port)
            s.sendall(struct.pack(">i", 100_000_000) + struct.pack(">hhi", 0, 9, i) + bytes(47))
            socks.append(s)
        seen = pinger.answered
        wait_until(lambda: pinger.answered >= seen + 3, 30, "the unrelated client answered meanwhile")
        assert_rss_bounded(broker, rss0, 8 * 59, "8 announced 100 MB requests")
        # A well-formed client is served while the pool is held (its requests are small).
        other = connect(broker.host, broker.port)
        assert api_versions_ok(other, 7)
        other.close()
    for s in socks:
        s.close()
    after_abuse(broker, before, "after-announced")


def test_pipelined_requests_stay_in_the_kernel(broker, before):
    """A million ApiVersions pipelined on one connection whose responses are never read: the broker
    reads only while it has nothing to answer, so the bytes wait in the socket buffers."""
    rss0 = broker.rss_kb()
    one = api_versions_v0(1)
    chunk = one * 4096
    total = 1_000_000
    sent = 0
    s = connect(broker.host, broker.port)
    s.setblocking(False)
    with pinging(broker):
        deadline = time.monotonic() + 20
        while sent < total * len(one) and time.monotonic() < deadline:
            try:
                sent += s.send(chunk)
            except BlockingIOError:
                # The broker stopped reading: wait (bounded) for room, as a writer would.
                if not _writable(s, 0.5):
                    break
        assert sent < total * len(one), "the broker read a million pipelined requests without answering"
        assert_rss_bounded(broker, rss0, sent, "pipelined ApiVersions never read back")
    s.close()
    after_abuse(broker, before, "after-pipelined")


def _writable(sock: socket.socket, timeout: float) -> bool:
    import select
    return bool(select.select([], [sock], [], timeout)[1])


@pytest.mark.parametrize("names", [4_000_000, 1_000_000])
def test_metadata_naming_millions_of_empty_topics(broker, before, names):
    """Metadata v1 with millions of empty topic names (2 bytes each): refused before it is decoded into
    millions of objects (more than 1,000,000 elements, or past the decode budget of 6x its size + 56 MiB:
    a million empty names are charged 176 MB for 2 MB)."""
    body = struct.pack(">i", names) + b"\x00\x00" * names
    frame = request_frame(3, 1, 1, body)
    rss0 = broker.rss_kb()
    with pinging(broker):
        s = connect(broker.host, broker.port)
        s.sendall(frame)
        assert closed_by_peer(s, 60), "the broker neither refused nor answered"
        s.close()
        assert_rss_bounded(broker, rss0, len(frame), f"Metadata v1 naming {names} empty topics")
    after_abuse(broker, before, f"after-metadata-{names}")


def test_request_header_with_millions_of_tagged_fields(broker, before):
    """ApiVersions v3 (header v2) carrying 2 M empty tagged fields in its header."""
    n = 2_000_000
    tags = b"".join(uvarint(t) + b"\x00" for t in range(n))
    cid = b"abuse"
    payload = struct.pack(">hhih", 18, 3, 1, len(cid)) + cid + uvarint(n) + tags
    payload += b"\x06abuse\x041.0\x00"          # the body: client software name and version, no tags
    rss0 = broker.rss_kb()
    with pinging(broker):
        s = connect(broker.host, broker.port)
        s.sendall(struct.pack(">i", len(payload)) + payload)
        assert closed_by_peer(s, 60), "the broker neither refused nor answered"
        s.close()
        assert_rss_bounded(broker, rss0, len(payload), "a header of 2 M tagged fields")
    after_abuse(broker, before, "after-tagged")


def test_a_request_sent_one_byte_at_a_time_is_closed(broker_factory):
    """A request whose first bytes arrived must be complete within socket.request.receive.timeout.ms;
    the trickling client is closed and what it held is released, while others are served."""
    b = broker_factory(**{"socket.request.receive.timeout.ms": 1500})
    frame = api_versions_v0(1) + bytes(0)
    body = struct.pack(">i", 2_000_000) + frame[4:]          # announces 2 MB, sends a byte at a time
    s = connect(b.host, b.port)
    started = time.monotonic()
    closed = False
    with pinging(b):
        for byte in body + bytes(1000):
            try:
                s.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if closed_by_peer(s, 0.2):            # paces the trickle: one byte per 200 ms
                closed = True
                break
            assert time.monotonic() - started < 30, "the trickling connection was never closed"
    assert closed
    s.close()
    other = connect(b.host, b.port)
    assert api_versions_ok(other, 2)
    other.close()
