"""Real clients, raw sockets and an independent segment-file reader for the integration tests.

Every client is driven the same way: `produce_<client>(bootstrap, topic, msgs, ...)` writes `Msg`s and
returns what the client says was acknowledged; `consume_<client>(bootstrap, topic, ...)` reads from
the earliest (or a given) offset up to the end offsets the client itself asks for, and returns `Rec`s
normalised across clients (headers as a tuple of (str, bytes), timestamp type as "create"/"append").
Nothing here imports odradek: the tests must not use our own encoder to check our own decoder.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from crc32c import crc32c

CONSUME_TIMEOUT_S = 20.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


# ------------------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class Msg:
    """A record to produce."""
    key: bytes | None
    value: bytes | None
    headers: tuple = ()              # ((str, bytes), ...)
    timestamp: int | None = None     # CreateTime in ms, None for the client's clock
    partition: int | None = None


@dataclass(frozen=True)
class Rec:
    """A record as a consumer saw it."""
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    ts_type: str                     # "create" or "append"
    ts: int

    def content(self) -> tuple:
        return (self.key, self.value, self.headers)


@dataclass
class Ack:
    partition: int
    offset: int
    timestamp: int | None = None     # as the client reports it (LogAppendTime from the broker)
    error: object = None
    msg: Msg | None = None


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll `predicate` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as e:  # noqa: BLE001 - reported below if it never succeeds
            last_exc = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else ""))
        time.sleep(interval)


def _norm_headers(headers) -> tuple:
    if not headers:
        return ()
    return tuple((k, None if v is None else bytes(v)) for k, v in headers)


def _ordered(records: list[Rec]) -> list[Rec]:
    """By partition, then offset (each partition's order is the consumer's own, kept as read)."""
    return sorted(records, key=lambda r: r.partition)


def sample_messages(n: int, *, base_ts: int | None, text: bool = True, prefix: str = "") -> list[Msg]:
    """A mix: keyed and unkeyed, tombstones, headers (several, repeated, empty), compressible values."""
    out = []
    for i in range(n):
        key = None if i % 5 == 3 and i % 7 != 5 else f"{prefix}key-{i}".encode()
        if i % 7 == 5:
            value = None
        elif text:
            value = (f"{prefix}value-{i} " * (1 + i % 13)).encode()
        else:
            value = bytes((i * 31 + j) % 256 for j in range(1 + i % 200))
        if i % 4 == 0:
            headers = ()
        elif i % 4 == 1:
            headers = (("h1", f"v{i}".encode()),)
        elif i % 4 == 2:
            headers = (("a", b"1"), ("b", b""), ("a", b"2"))
        else:
            headers = (("trace-id", f"{i:08x}".encode()), ("source", prefix.encode() or b"x"))
        ts = None if base_ts is None else base_ts + i * 10
        out.append(Msg(key, value, headers, ts))
    return out


# ------------------------------------------------------------------------------------------ confluent
def confluent_config(bootstrap: str, **extra) -> dict:
    conf = {"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000, "message.timeout.ms": 20000,
            "api.version.request.timeout.ms": 10000, "log.connection.close": False}
    conf.update({k.replace("_", "."): v for k, v in extra.items()})
    return conf


def produce_confluent(bootstrap: str, topic: str, msgs: Iterable[Msg], *, compression: str = "none",
                      flush_each: bool = False, flush_every: int = 0, raise_errors: bool = True,
                      **config) -> list[Ack]:
    """flush_each / flush_every=n: wait for delivery after every record / every n records."""
    from confluent_kafka import Producer

    p = Producer(confluent_config(bootstrap, **{"compression.type": compression, "linger.ms": 5, **config}))
    acks: list[Ack] = []

    def report(err, m, msg):
        ts_type, ts = m.timestamp()
        acks.append(Ack(m.partition() if m.partition() is not None else -1,
                        m.offset() if m.offset() is not None else -1,
                        ts if ts_type == 2 else None, err, msg))

    flush_every = 1 if flush_each else flush_every
    for i, msg in enumerate(msgs):
        kwargs = {}
        if msg.partition is not None:
            kwargs["partition"] = msg.partition
        if msg.timestamp is not None:
            kwargs["timestamp"] = msg.timestamp
        p.produce(topic, value=msg.value, key=msg.key, headers=list(msg.headers) or None,
                  on_delivery=lambda err, m, msg=msg: report(err, m, msg), **kwargs)
        p.poll(0)
        if flush_every and (i + 1) % flush_every == 0:
            assert p.flush(20) == 0, "confluent producer did not deliver within 20s"
    assert p.flush(30) == 0, "confluent producer did not deliver within 30s"
    if raise_errors:
        errors = [a.error for a in acks if a.error is not None]
        assert not errors, f"confluent producer errors: {errors[:5]}"
    return acks


def confluent_consumer(bootstrap: str, **config):
    from confluent_kafka import Consumer

    return Consumer(confluent_config(bootstrap, **{
        "group.id": "odradek-it", "enable.auto.commit": False, "enable.partition.eof": False,
        "auto.offset.reset": "earliest", **config}))


def _rec_from_confluent(m) -> Rec:
    ts_type, ts = m.timestamp()
    return Rec(m.partition(), m.offset(), m.key(), m.value(), _norm_headers(m.headers()),
               {1: "create", 2: "append"}.get(ts_type, f"type{ts_type}"), ts)


def consume_confluent(bootstrap: str, topic: str, partitions: Iterable[int] = (0,), *,
                      start: dict[int, int] | None = None, timeout: float = CONSUME_TIMEOUT_S,
                      **config) -> list[Rec]:
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    c = confluent_consumer(bootstrap, **config)
    try:
        parts = list(partitions)
        ends = {}
        for p in parts:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            ends[p] = high
        begin = {p: (start or {}).get(p, OFFSET_BEGINNING) for p in parts}
        c.assign([TopicPartition(topic, p, begin[p]) for p in parts])
        out: list[Rec] = []
        nxt = {p: (begin[p] if begin[p] >= 0 else 0) for p in parts}
        deadline = time.monotonic() + timeout
        while any(nxt[p] < ends[p] for p in parts):
            if time.monotonic() > deadline:
                raise AssertionError(f"confluent consumer: only reached {nxt} of {ends} in {topic}")
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                raise AssertionError(f"confluent consumer error: {m.error()}")
            out.append(_rec_from_confluent(m))
            nxt[m.partition()] = m.offset() + 1
        return _ordered(out)
    finally:
        c.close()


# ------------------------------------------------------------------------------------------ kafka-python
def produce_kafka_python(bootstrap: str, topic: str, msgs: Iterable[Msg], *, compression: str = "none",
                         api_version=None, **config) -> list[Ack]:
    from kafka import KafkaProducer

    kw = dict(bootstrap_servers=bootstrap, compression_type=None if compression == "none" else compression,
              linger_ms=5, request_timeout_ms=20000, **config)
    if api_version is not None:
        kw["api_version"] = api_version
    p = KafkaProducer(**kw)
    try:
        futures = []
        for msg in msgs:
            futures.append((msg, p.send(topic, key=msg.key, value=msg.value, partition=msg.partition,
                                        headers=list(msg.headers) or None, timestamp_ms=msg.timestamp)))
        p.flush(30)
        acks = []
        for msg, f in futures:
            md = f.get(timeout=20)
            acks.append(Ack(md.partition, md.offset, md.timestamp, None, msg))
        return acks
    finally:
        p.close(timeout=10)


def kafka_python_consumer(bootstrap: str, **config):
    from kafka import KafkaConsumer

    kw = dict(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
              request_timeout_ms=20000)
    kw.update(config)
    return KafkaConsumer(**kw)


def _rec_from_kafka_python(m) -> Rec:
    ts_type = {0: "create", 1: "append"}.get(m.timestamp_type, f"type{m.timestamp_type}")
    return Rec(m.partition, m.offset, m.key, m.value, _norm_headers(m.headers), ts_type, m.timestamp)


def consume_kafka_python(bootstrap: str, topic: str, partitions: Iterable[int] = (0,), *,
                         start: dict[int, int] | None = None, timeout: float = CONSUME_TIMEOUT_S,
                         **config) -> list[Rec]:
    from kafka import TopicPartition

    c = kafka_python_consumer(bootstrap, **config)
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        c.assign(tps)
        ends = c.end_offsets(tps)
        for tp in tps:
            if start and tp.partition in start:
                c.seek(tp, start[tp.partition])
            else:
                c.seek_to_beginning(tp)
        out: list[Rec] = []
        deadline = time.monotonic() + timeout
        while any(c.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise AssertionError(f"kafka-python consumer: only reached "
                                     f"{[c.position(tp) for tp in tps]} of {ends}")
            for _, batch in c.poll(timeout_ms=200).items():
                out.extend(_rec_from_kafka_python(m) for m in batch)
        return _ordered(out)
    finally:
        c.close()


# ------------------------------------------------------------------------------------------ aiokafka
def produce_aiokafka(bootstrap: str, topic: str, msgs: Iterable[Msg], *, compression: str = "none",
                     **config) -> list[Ack]:
    from aiokafka import AIOKafkaProducer

    async def run():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap,
                             compression_type=None if compression == "none" else compression,
                             linger_ms=5, request_timeout_ms=20000, **config)
        await p.start()
        try:
            futures = []
            for msg in msgs:
                futures.append((msg, await p.send(topic, value=msg.value, key=msg.key, partition=msg.partition,
                                                  timestamp_ms=msg.timestamp,
                                                  headers=list(msg.headers) or None)))
            await p.flush()
            acks = []
            for msg, f in futures:
                md = await asyncio.wait_for(f, 20)
                acks.append(Ack(md.partition, md.offset,
                                md.timestamp if md.timestamp_type == 1 else None, None, msg))
            return acks
        finally:
            await p.stop()

    return asyncio.run(run())


def consume_aiokafka(bootstrap: str, topic: str, partitions: Iterable[int] = (0,), *,
                     start: dict[int, int] | None = None, timeout: float = CONSUME_TIMEOUT_S,
                     **config) -> list[Rec]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run():
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest", request_timeout_ms=20000, **config)
        await c.start()
        try:
            tps = [TopicPartition(topic, p) for p in partitions]
            c.assign(tps)
            ends = await c.end_offsets(tps)
            for tp in tps:
                if start and tp.partition in start:
                    c.seek(tp, start[tp.partition])
                else:
                    await c.seek_to_beginning(tp)
            out: list[Rec] = []
            deadline = time.monotonic() + timeout
            while True:
                positions = {tp: await c.position(tp) for tp in tps}
                if all(positions[tp] >= ends[tp] for tp in tps):
                    return _ordered(out)
                if time.monotonic() > deadline:
                    raise AssertionError(f"aiokafka consumer: only reached {positions} of {ends}")
                for _, batch in (await c.getmany(timeout_ms=200)).items():
                    for m in batch:
                        ts_type = {0: "create", 1: "append"}.get(m.timestamp_type, f"type{m.timestamp_type}")
                        out.append(Rec(m.partition, m.offset, m.key, m.value, _norm_headers(m.headers),
                                       ts_type, m.timestamp))
        finally:
            await c.stop()

    return asyncio.run(run())


# ------------------------------------------------------------------------------------------ kcat
def kcat_path() -> str:
    path = shutil.which("kcat") or shutil.which("kafkacat")
    if path is None:
        raise AssertionError("kcat is not installed: run the README's test command (apt-get install kcat)")
    return path


def produce_kcat(bootstrap: str, topic: str, msgs: list[Msg], *, compression: str = "none") -> None:
    """kcat writes lines: every Msg needs a text key and value without tabs or newlines (an empty
    key or value is sent as null, -Z), and all of them the same headers (-H applies to every record)."""
    headers = msgs[0].headers if msgs else ()
    assert all(m.headers == headers for m in msgs), "kcat sends the same headers with every record"
    assert all(m.timestamp is None for m in msgs), "kcat cannot set timestamps"
    lines = []
    for m in msgs:
        k = (m.key or b"").decode()
        v = (m.value or b"").decode()
        assert "\t" not in k + v and "\n" not in k + v
        lines.append(f"{k}\t{v}")
    cmd = [kcat_path(), "-b", bootstrap, "-P", "-t", topic, "-K", "\t", "-Z", "-q"]
    if compression != "none":
        cmd += ["-z", compression]
    for hk, hv in headers:
        cmd += ["-H", f"{hk}={hv.decode()}"]
    cmd += ["-p", str(msgs[0].partition if msgs and msgs[0].partition is not None else 0)]
    r = subprocess.run(cmd, input=("\n".join(lines) + "\n").encode(), capture_output=True, timeout=60)
    assert r.returncode == 0, f"kcat produce failed ({r.returncode}): {r.stderr.decode(errors='replace')}"


def consume_kcat(bootstrap: str, topic: str, partitions: Iterable[int] = (0,), *,
                 start: dict[int, int] | None = None, timeout: float = CONSUME_TIMEOUT_S,
                 extra: Iterable[str] = ()) -> list[Rec]:
    out: list[Rec] = []
    for p in partitions:
        offset = str((start or {}).get(p, "beginning"))
        cmd = [kcat_path(), "-b", bootstrap, "-C", "-t", topic, "-p", str(p), "-o", offset, "-e", "-J", "-q",
               "-X", "fetch.wait.max.ms=100",
               *extra]
        r = subprocess.run(cmd, capture_output=True, timeout=timeout)
        assert r.returncode == 0, f"kcat consume failed ({r.returncode}): {r.stderr.decode(errors='replace')}"
        for line in r.stdout.decode().splitlines():
            if not line.strip():
                continue
            j = json.loads(line)
            h = j.get("headers") or []
            headers = tuple((h[i], None if h[i + 1] is None else h[i + 1].encode()) for i in range(0, len(h), 2))
            key = None if j.get("key") is None else j["key"].encode()
            value = None if j.get("payload") is None else j["payload"].encode()
            ts_type = {"create": "create", "logappend": "append"}.get(j.get("tstype"), j.get("tstype"))
            out.append(Rec(j["partition"], j["offset"], key, value, headers, ts_type, j["ts"]))
    return _ordered(out)


PRODUCERS = {"confluent": produce_confluent, "kafka-python": produce_kafka_python,
             "aiokafka": produce_aiokafka, "kcat": produce_kcat}
CONSUMERS = {"confluent": consume_confluent, "kafka-python": consume_kafka_python,
             "aiokafka": consume_aiokafka, "kcat": consume_kcat}


# ------------------------------------------------------------------------------------------ segment files
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")   # v2 record batch header, 61 bytes
BATCH_HEADER_SIZE = BATCH_HEADER.size


@dataclass
class DiskBatch:
    position: int
    base_offset: int
    length: int                     # batch_length (bytes after the length field)
    magic: int
    crc_ok: bool
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    records_count: int

    @property
    def size(self) -> int:
        return 12 + self.length

    @property
    def end(self) -> int:
        return self.position + self.size

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def codec(self) -> str:
        return CODECS[self.attributes & 7] if self.attributes & 7 < len(CODECS) else f"codec{self.attributes & 7}"


@dataclass
class SegmentScan:
    batches: list[DiskBatch] = field(default_factory=list)
    valid_end: int = 0               # end of the last whole, CRC-valid batch
    size: int = 0
    problem: str | None = None


def scan_segment(path: os.PathLike | str) -> SegmentScan:
    """Read a .log file batch by batch with our own parser and CRC-32C check."""
    data = open(path, "rb").read()
    scan = SegmentScan(size=len(data))
    pos = 0
    while pos < len(data):
        if len(data) - pos < BATCH_HEADER_SIZE:
            scan.problem = f"{len(data) - pos} trailing bytes at {pos}"
            break
        (base, length, _epoch, magic, crc, attrs, lod, base_ts, max_ts, _pid, _pe, _seq,
         count) = BATCH_HEADER.unpack_from(data, pos)
        if magic != 2 or length < BATCH_HEADER_SIZE - 12 or pos + 12 + length > len(data):
            scan.problem = f"bad batch header at {pos} (magic {magic}, length {length})"
            break
        ok = crc32c(data[pos + 21:pos + 12 + length]) == crc
        scan.batches.append(DiskBatch(pos, base, length, magic, ok, attrs, lod, base_ts, max_ts, count))
        if not ok:
            scan.problem = f"CRC mismatch in batch at {pos}"
            break
        pos += 12 + length
        scan.valid_end = pos
    return scan


def partition_dir(log_dir: os.PathLike | str, topic: str, partition: int) -> str:
    return os.path.join(log_dir, f"{topic}-{partition}")


def segment_files(log_dir, topic: str, partition: int) -> list[str]:
    d = partition_dir(log_dir, topic, partition)
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".log"))


def assert_partition_valid(log_dir, topic: str, partition: int) -> list[DiskBatch]:
    """Every segment of the partition is wholly made of CRC-valid batches with increasing offsets."""
    batches: list[DiskBatch] = []
    for path in segment_files(log_dir, topic, partition):
        scan = scan_segment(path)
        assert scan.problem is None, f"{path}: {scan.problem}"
        batches.extend(scan.batches)
    for a, b in zip(batches, batches[1:]):
        assert b.base_offset > a.last_offset, f"offsets go backwards: {a} then {b}"
    return batches


# ------------------------------------------------------------------------------------------ raw wire
def api_versions_v0(correlation_id: int, client_id: str = "raw") -> bytes:
    """A whole ApiVersions v0 request frame (request header v1, empty body)."""
    cid = client_id.encode()
    body = struct.pack(">hhih", 18, 0, correlation_id, len(cid)) + cid
    return struct.pack(">i", len(body)) + body


def request_frame(api_key: int, api_version: int, correlation_id: int, body: bytes = b"",
                  client_id: str = "raw") -> bytes:
    cid = client_id.encode()
    payload = struct.pack(">hhih", api_key, api_version, correlation_id, len(cid)) + cid + body
    return struct.pack(">i", len(payload)) + payload


def connect(host: str, port: int, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection((host, port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(sock: socket.socket, n: int, timeout: float) -> bytes | None:
    """n bytes, or None if the peer closed first."""
    sock.settimeout(timeout)
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


def recv_frame(sock: socket.socket, timeout: float = 10.0) -> bytes | None:
    head = recv_exact(sock, 4, timeout)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return recv_exact(sock, size, timeout)


def api_versions_ok(sock: socket.socket, correlation_id: int, timeout: float = 10.0) -> bool:
    """Send ApiVersions v0 and check that its answer carries our correlation id and error 0."""
    sock.sendall(api_versions_v0(correlation_id))
    resp = recv_frame(sock, timeout)
    if resp is None:
        return False
    cid, err = struct.unpack_from(">ih", resp)
    return cid == correlation_id and err == 0


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True when the peer closes (EOF or reset) within timeout; data received in between is skipped."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except (socket.timeout, TimeoutError):
            return False
        if not chunk:
            return True


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def fetch_v4(correlation_id: int, topic: str, partition: int, offset: int, *, max_wait_ms: int = 0,
             min_bytes: int = 1, max_bytes: int = 10 * 1024 * 1024) -> bytes:
    """A whole Fetch v4 request frame for one partition (non-flexible, read_uncommitted)."""
    t = topic.encode()
    body = struct.pack(">iiiib", -1, max_wait_ms, min_bytes, max_bytes, 0)
    body += struct.pack(">ih", 1, len(t)) + t + struct.pack(">iiqi", 1, partition, offset, max_bytes)
    return request_frame(1, 4, correlation_id, body)


class RawClient:
    """One connection speaking the protocol through kafka-python's generated message classes (their
    encoder and decoder, not ours): `call(request, response_cls, version)`."""

    def __init__(self, bootstrap: str, timeout: float = 60.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._ids = iter(range(1, 2**31))

    def call(self, request, response_cls, version: int):
        return response_cls.decode(self.call_raw(request, version), version=version, header=True)

    def call_raw(self, request, version: int) -> bytes:
        """The response frame (header and body), undecoded."""
        request.with_header(correlation_id=next(self._ids), client_id="raw-client")
        self.sock.sendall(request.encode(version=version, header=True, framed=True))
        size = struct.unpack(">i", self.read(4))[0]
        return self.read(size)

    def read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            assert chunk, "connection closed by the broker"
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
