"""Hostile and broken traffic on live sockets, while real clients keep working: malformed frames (negative
and oversized sizes, garbage, unknown API keys, truncated headers and bodies), half-sent frames left
open, a thousand idle connections. The broker closes what it cannot parse, answers the rest, stays
up with bounded memory and logs no traceback (checked at teardown). connections.max.idle.ms and
max.connections.per.ip are enforced."""

from __future__ import annotations

import os
import random
import socket
import struct
import threading
import time

from .clients import (
    Msg, api_versions_ok, api_versions_v0, closed_by_peer, confluent_config, confluent_consumer, connect,
    consume_confluent, fetch_v4, produce_confluent, recv_exact, recv_frame, request_frame, wait_until,
)

MAX_REQUEST_BYTES = 1048576
BROKER_OVERRIDES = {"socket.request.max.bytes": MAX_REQUEST_BYTES}
RSS_LIMIT_KB = 300 * 1024
SERVED = {0: (0, 13), 1: (0, 18), 2: (0, 11), 3: (0, 13), 18: (0, 4), 22: (0, 5)}


def open_sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            pass
    return n


class Workload(threading.Thread):
    """A confluent producer and consumer in a loop: every value produced must come back, in order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.topic = topic
        self.stop = threading.Event()
        self.produced: list[bytes] = []
        self.consumed: list[bytes] = []
        self.errors: list = []
        self.lock = threading.Lock()

    def progress(self) -> int:
        with self.lock:
            return len(self.consumed)

    def run(self) -> None:
        from confluent_kafka import Producer, TopicPartition

        p = Producer(confluent_config(self.bootstrap, **{"linger.ms": 1}))
        c = confluent_consumer(self.bootstrap, **{"fetch.wait.max.ms": 100})
        c.assign([TopicPartition(self.topic, 0, 0)])

        def report(err, msg):
            if err is not None:
                self.errors.append(err)

        i = 0
        try:
            while not self.stop.is_set() or len(self.consumed) < len(self.produced):
                if not self.stop.is_set():
                    value = f"work-{i}".encode()
                    p.produce(self.topic, value=value, partition=0, on_delivery=report)
                    self.produced.append(value)
                    i += 1
                    p.poll(0)
                elif p.flush(10):
                    self.errors.append("flush timed out")
                    return
                m = c.poll(0.02)
                if m is not None:
                    if m.error():
                        self.errors.append(m.error())
                    else:
                        with self.lock:
                            self.consumed.append(m.value())
                if self.stop.is_set() and time.monotonic() > self.deadline:
                    self.errors.append("consumer did not catch up")
                    return
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)
        finally:
            c.close()

    def finish(self) -> None:
        self.deadline = time.monotonic() + 30
        self.stop.set()
        self.join(60)
        assert not self.is_alive(), "workload did not finish"
        assert not self.errors, self.errors[:5]
        assert self.consumed == self.produced


def outcome(sock: socket.socket, correlation_id: int, timeout: float = 10.0) -> str:
    """After a bad request and then a good ApiVersions (correlation_id): 'closed' if the broker closed
    the connection, 'answered' if the ApiVersions came back (after any answer to the bad one)."""
    try:
        sock.sendall(api_versions_v0(correlation_id))
    except (BrokenPipeError, ConnectionResetError):
        return "closed"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            resp = recv_frame(sock, max(deadline - time.monotonic(), 0.01))
        except (socket.timeout, TimeoutError):
            break
        if resp is None:
            return "closed"
        if len(resp) >= 4 and struct.unpack_from(">i", resp)[0] == correlation_id:
            return "answered"
    return "hung"


MALFORMED = {
    "negative size": struct.pack(">i", -1) + b"abcd",
    "negative size 2": struct.pack(">i", -2_000_000_000),
    "huge size": struct.pack(">i", 2**31 - 1) + b"x" * 100,
    "one byte over socket.request.max.bytes": struct.pack(">i", MAX_REQUEST_BYTES + 1) + b"\0" * 4096,
    "zero size": struct.pack(">i", 0),
    "truncated header": struct.pack(">i", 3) + b"\x00\x12\x00",
    "header without client id": struct.pack(">i", 8) + struct.pack(">hhi", 3, 1, 7),
    "client id longer than frame": struct.pack(">i", 10) + struct.pack(">hhih", 18, 0, 7, 1000),
    "unknown api key": request_frame(4242, 0, 7),
    "negative api key": request_frame(-5, 0, 7),
    "unsupported metadata version": request_frame(3, 999, 7),
    "metadata with huge topic count": request_frame(3, 1, 7, struct.pack(">i", 2**31 - 1)),
    "metadata with truncated topic": request_frame(3, 1, 7, struct.pack(">ih", 1, 500) + b"abc"),
    "produce with huge records length": request_frame(
        0, 3, 7, struct.pack(">hhii", -1, 1, 1000, 1) + struct.pack(">h", 1) + b"t"
        + struct.pack(">iii", 1, 0, 2**31 - 2)),
    "produce cut mid body": request_frame(0, 7, 7, struct.pack(">hhii", -1, 1, 1000, 1))[:-3],
    "fetch v11 garbage": request_frame(1, 11, 7, b"\xff" * 40),
    "flexible header bad tags": request_frame(18, 3, 7, b"\x05\xff\xff\xff\xff\xff"),
    "flexible header cut before its tags": request_frame(18, 3, 7),
}


def test_bad_traffic_while_clients_work(broker):
    host, port = broker.host, broker.port
    work = Workload(broker.bootstrap, "bad-traffic-work")
    work.start()
    wait_until(lambda: work.progress() >= 50, 30, "the workload to get going")

    # 1. Malformed frames: each on its own connection, the broker closes it (never a crash).
    results = {}
    for name, data in MALFORMED.items():
        s = connect(host, port)
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        results[name] = outcome(s, 99)
        s.close()
    not_closed = {k: v for k, v in results.items() if v != "closed"}
    assert not not_closed, f"the broker should close these connections: {not_closed}"
    # ApiVersions at an unknown version whose header is cut before its tagged fields: Kafka closes,
    # a lenient broker may answer UNSUPPORTED_VERSION; either way it must not hang.
    s = connect(host, port)
    s.sendall(request_frame(18, 99, 7))
    assert outcome(s, 99) in ("closed", "answered")
    s.close()

    # ApiVersions at an unknown version is answered (KIP-511) with UNSUPPORTED_VERSION, not closed;
    # its header is a flexible one (v2): client id, then an empty tagged-field section.
    s = connect(host, port)
    s.sendall(request_frame(18, 99, 5, b"\x00"))
    resp = recv_frame(s)
    assert resp is not None and struct.unpack_from(">ih", resp) == (5, 35)
    assert api_versions_ok(s, 6)
    s.close()

    # 2. Random bodies behind valid headers for every served API and version: answered or closed.
    rng = random.Random(1234)
    fuzz = {}
    for key, (lo, hi) in SERVED.items():
        for version in range(lo, hi + 1):
            for _ in range(3):
                body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 120)))
                s = connect(host, port)
                s.sendall(request_frame(key, version, 11, body))
                fuzz[(key, version, body)] = outcome(s, 12)
                s.close()
    print("fuzz outcomes:", {o: sum(1 for v in fuzz.values() if v == o) for o in set(fuzz.values())})
    hung = [k[:2] for k, v in fuzz.items() if v == "hung"]
    assert not hung, f"no answer and no close for {hung}"

    # 3. Pipelining: 200 requests in one write come back in order.
    s = connect(host, port)
    s.sendall(b"".join(api_versions_v0(1000 + i) for i in range(200)))
    ids = [struct.unpack_from(">i", recv_frame(s))[0] for _ in range(200)]
    assert ids == [1000 + i for i in range(200)]
    # ... and a request dribbled in byte by byte is answered.
    for b in api_versions_v0(77):
        s.sendall(bytes([b]))
    resp = recv_frame(s)
    assert resp is not None and struct.unpack_from(">i", resp)[0] == 77
    s.close()

    # 4. Half-sent frames, left open; and a thousand idle connections.
    half = []
    for i in range(50):
        h = connect(host, port)
        h.sendall(struct.pack(">i", 900_000) + b"\x00\x03\x00\x01" + b"z" * (i * 2000))
        half.append(h)
    for i in range(20):
        h = connect(host, port)
        h.sendall(struct.pack(">i", 30)[: 1 + i % 3])     # part of a size prefix
        half.append(h)
    idle = [connect(host, port) for _ in range(1000)]
    wait_until(lambda: open_sockets(broker.pid) > 1070, 30,
               "the broker to accept the 1070 connections")
    before = work.progress()
    wait_until(lambda: work.progress() >= before + 100, 30, "the workload to go on beside 1000 idle sockets")
    s = connect(host, port)
    assert api_versions_ok(s, 3)
    s.close()
    assert broker.running
    rss = broker.rss_kb()
    print(f"broker RSS with 1070 connections open: {rss} kB")
    assert rss < RSS_LIMIT_KB, f"broker RSS {rss} kB"
    # None of them was dropped: they are idle, well within connections.max.idle.ms.
    for sock in idle[::50]:
        assert api_versions_ok(sock, 4), "an idle connection stopped working"
    for sock in idle + half:
        sock.close()

    work.finish()
    assert broker.running
    assert broker.rss_kb() < RSS_LIMIT_KB


def test_clients_that_stop_reading_or_vanish_mid_response(broker):
    """Pipelined fetches of megabytes from clients that close halfway through a response, or never read
    at all: the broker neither buffers every response (RSS stays bounded) nor trips over the closed
    sockets (no traceback), and a well-behaved consumer is unaffected."""
    topic = "big-fetch"
    msgs = [Msg(f"k{i}".encode(), bytes([65 + i % 26]) * 200_000, ()) for i in range(40)]
    produce_confluent(broker.bootstrap, topic, msgs, **{"linger.ms": 20})
    host, port = broker.host, broker.port
    baseline = open_sockets(broker.pid)

    # Clients that read a little of a large response, then close.
    for i in range(30):
        s = connect(host, port)
        s.sendall(b"".join(fetch_v4(i * 100 + j, topic, 0, 0) for j in range(10)))
        assert recv_exact(s, 4 + (i * 7919) % 300_000, 10) is not None
        s.close()
    # Clients that never read: each has 40 fetches of about 8 MB outstanding.
    stuck = []
    for i in range(5):
        s = connect(host, port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"".join(fetch_v4(j, topic, 0, 0) for j in range(40)))
        stuck.append(s)
    wait_until(lambda: api_versions_ok(connect(host, port), 1), 10, "the broker to answer others")
    got = consume_confluent(broker.bootstrap, topic)
    assert [r.value for r in got] == [m.value for m in msgs]
    rss = broker.rss_kb()
    print(f"broker RSS with 5 clients that never read 40 responses of 8 MB each: {rss} kB")
    assert rss < RSS_LIMIT_KB, f"broker RSS {rss} kB"
    for s in stuck:
        s.close()
    s = connect(host, port)
    assert api_versions_ok(s, 2)
    s.close()
    assert broker.running
    # Every one of those connections is gone on the broker's side too (no leaked sockets).
    wait_until(lambda: open_sockets(broker.pid) <= baseline, 10, f"the broker's sockets to return to {baseline}")


def test_connections_max_idle_ms(broker_factory):
    idle_ms = 1000
    b = broker_factory(**{"connections.max.idle.ms": idle_ms})
    opened = time.monotonic()
    quiet = [connect(b.host, b.port) for _ in range(20)]
    half = connect(b.host, b.port)
    half.sendall(struct.pack(">i", 100) + b"\x00\x12")      # a frame that never completes
    busy = connect(b.host, b.port)
    # The busy connection sends a request every 300 ms for 3 idle periods and stays open.
    for i in range(10):
        assert api_versions_ok(busy, i), f"busy connection dropped after {i} requests"
        time.sleep(0.3)
    for s in quiet + [half]:
        assert closed_by_peer(s, 10), "idle connection not closed"
        s.close()
    assert time.monotonic() - opened >= idle_ms / 1000
    assert api_versions_ok(busy, 100)
    busy.close()
    # A fresh connection closes no sooner than connections.max.idle.ms.
    s = connect(b.host, b.port)
    t0 = time.monotonic()
    assert closed_by_peer(s, 10)
    assert time.monotonic() - t0 >= 0.9 * idle_ms / 1000
    s.close()
    # And a real client with a long-lived connection reconnects and works.
    from confluent_kafka import Producer
    p = Producer(confluent_config(b.bootstrap))
    p.produce("idle-t", value=b"1")
    assert p.flush(10) == 0


def test_max_connections_per_ip(broker_factory):
    limit = 8
    b = broker_factory(**{"max.connections.per.ip": limit})
    conns = [connect(b.host, b.port) for _ in range(limit)]
    for i, s in enumerate(conns):
        assert api_versions_ok(s, i)
    extra = connect(b.host, b.port)          # the TCP handshake completes; the broker drops it
    try:
        extra.sendall(api_versions_v0(50))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert closed_by_peer(extra, 10), "connection beyond max.connections.per.ip was served"
    extra.close()
    assert all(api_versions_ok(s, 60 + i) for i, s in enumerate(conns)), "admitted connections still work"
    # Once one closes, a new one is admitted again.
    conns.pop().close()

    def admitted():
        s = connect(b.host, b.port)
        if api_versions_ok(s, 70, timeout=5):
            return s
        s.close()
        return None
    conns.append(wait_until(admitted, 10, "a connection slot to free up"))
    for s in conns:
        s.close()


def test_clean_shutdown_with_busy_idle_and_stuck_connections(broker_factory):
    """SIGTERM while 500 connections are idle, some hold half-sent frames, some wait in a long poll and
    some never read their responses: the broker still exits at once, cleanly, with its marker."""
    b = broker_factory()
    topic = "shutdown"
    produce_confluent(b.bootstrap, topic, [Msg(b"k", bytes([66]) * 300_000, ()) for _ in range(10)])
    socks = [connect(b.host, b.port) for _ in range(500)]
    for s in socks[:20]:
        s.sendall(struct.pack(">i", 1000) + b"\x00\x12")
    for i, s in enumerate(socks[20:30]):           # long polls at the log end
        s.sendall(fetch_v4(i, topic, 0, 10, max_wait_ms=60_000, min_bytes=1))
    for s in socks[30:35]:                         # never read: 20 responses of 3 MB each
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"".join(fetch_v4(j, topic, 0, 0) for j in range(20)))
    wait_until(lambda: open_sockets(b.pid) >= 500, 20, "the broker to accept the connections")
    t0 = time.monotonic()
    assert b.stop(timeout=20) == 0
    assert time.monotonic() - t0 < 10
    assert b.clean_shutdown_marker.exists()
    for s in socks:
        s.close()
    b.start()
    got = consume_confluent(b.bootstrap, topic)
    assert len(got) == 10
