"""Stall benchmark: how long an unrelated client waits while an abusive input is sent.

For each input of the hardening issue's table, a fresh broker is started; an unrelated client pings it
with ApiVersions every 50 ms on its own connection while the input is sent on others, until the broker
has answered the input or closed its connection. Reported per row: the unrelated client's longest wait
(target under 250 ms), the broker's RSS growth against the bytes sent, and what the broker did.
The broker must stay alive through every row.

    python bench/stall_bench.py [--only ROW ...] [--peer] [--out FILE]

`--peer` runs the same rows against Tansu too (same run, one broker at a time), for comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from brokers import Broker, default_command, install_cleanup  # noqa: E402

from odradek.records.varint import encode_uvarint as uvarint, encode_varlong as varint  # noqa: E402

TARGET_MS = 250.0
QUIET = {"log_level": 3}


# ----------------------------------------------------------------------------------------- wire helpers
def frame(api_key: int, version: int, body: bytes, cid: int = 1, client: bytes = b"stall") -> bytes:
    payload = struct.pack(">hhih", api_key, version, cid, len(client)) + client + body
    return struct.pack(">i", len(payload)) + payload


def s16(text: str) -> bytes:
    b = text.encode()
    return struct.pack(">h", len(b)) + b


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def answered_or_closed(sock: socket.socket, timeout: float) -> str:
    """Read until one whole response arrived ('answered') or the peer closed ('closed')."""
    deadline = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([sock], [], [], 0.5)
        if not r:
            continue
        try:
            chunk = sock.recv(1 << 20)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        if not chunk:
            return "closed"
        buf += chunk
        if len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
            return "answered"
    return "no answer"


class Pinger(threading.Thread):
    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.worst_s = 0.0
        self.count = 0

    def run(self) -> None:
        sock = connect(self.port)
        sock.settimeout(300)
        cid = 0
        while not self.stop.is_set():
            cid += 1
            t0 = time.monotonic()
            sock.sendall(frame(18, 0, b"", cid))
            head = _recv(sock, 4)
            if head is None:
                return
            _recv(sock, struct.unpack(">i", head)[0])
            self.worst_s = max(self.worst_s, time.monotonic() - t0)
            self.count += 1
            self.stop.wait(0.05)


def _recv(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# ----------------------------------------------------------------------------------------- inputs
def produce_v(version: int, topic: str, records: bytes, acks: int = 1) -> bytes:
    body = b"\xff\xff" if version >= 3 else b""                   # transactional id: null
    body += struct.pack(">hi", acks, 30000) + struct.pack(">i", 1) + s16(topic)
    body += struct.pack(">i", 1) + struct.pack(">ii", 0, len(records)) + records
    return frame(0, version, body)


def legacy_gzip_bomb(messages: int) -> bytes:
    """One magic-1 gzip wrapper whose inner set holds `messages` empty messages."""
    def message(offset: int, attributes: int, key: bytes | None, value: bytes | None) -> bytes:
        body = struct.pack(">bbq", 1, attributes, int(time.time() * 1000))
        body += (b"\xff\xff\xff\xff" if key is None else struct.pack(">i", len(key)) + key)
        body += (b"\xff\xff\xff\xff" if value is None else struct.pack(">i", len(value)) + value)
        crc = zlib.crc32(body)
        return struct.pack(">qiI", offset, len(body) + 4, crc) + body
    inner = message(0, 0, None, None) * messages     # inner offsets all 0: it compresses ~350:1
    return message(messages - 1, 1, None, zlib.compress(inner, 9))


def zstd_keyed_batch(records: int) -> bytes:
    """A v2 zstd batch claiming `records` records with key b'k' and no value, all alike (offset delta 0:
    a lie the validator must catch; it is what makes the batch compress to a few KB)."""
    import cramjam
    from crc32c import crc32c

    rec = b"\x00" + varint(0) + varint(0) + varint(1) + b"k" + varint(-1) + varint(0)
    compressed = bytes(cramjam.zstd.compress((varint(len(rec)) + rec) * records, level=19))
    now = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", 4, records - 1, now, now, -1, -1, -1, records) + compressed
    head = struct.pack(">qiib", 0, len(after_crc) + 9, -1, 2)
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def fetch_v2(topic: str, copies: int, max_bytes: int = 64 << 20) -> bytes:
    body = struct.pack(">iii", -1, 0, 1) + struct.pack(">i", 1) + s16(topic)
    body += struct.pack(">i", copies) + struct.pack(">iqi", 0, 0, max_bytes) * copies
    return frame(1, 2, body)


def list_offsets_v1(topic: str, timestamp: int) -> bytes:
    body = struct.pack(">i", -1) + struct.pack(">i", 1) + s16(topic) + struct.pack(">iiq", 1, 0, timestamp)
    return frame(2, 1, body)


def create_topics_v0(topics: list[tuple[str, int]]) -> bytes:
    body = struct.pack(">i", len(topics))
    for name, parts in topics:
        body += s16(name) + struct.pack(">ihii", parts, 1, 0, 0)
    return frame(19, 0, body + struct.pack(">i", 60000))


def metadata_v4(names: list[str], auto_create: bool = True) -> bytes:
    body = struct.pack(">i", len(names)) + b"".join(s16(n) for n in names) + bytes([auto_create])
    return frame(3, 4, body)


# ----------------------------------------------------------------------------------------- rows
def fill(bootstrap: str, topic: str, mib: int) -> None:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20, **QUIET})
    value = os.urandom(1024)
    for _ in range(mib * 1024):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def create(bootstrap: str, topic: str, configs: dict | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs or {})])[topic].result(60)


ROWS: dict[str, dict] = {
    "fetch-v2-64MiB": {"prepare": lambda b: (create(b, "big"), fill(b, "big", 64), [fetch_v2("big", 1)])[-1]},
    "fetch-v2-64MiB-x4": {"prepare": lambda b: (create(b, "big"), fill(b, "big", 64), [fetch_v2("big", 4)])[-1]},
    "produce-v2-gzip-bomb": {"prepare": lambda b: (create(b, "bomb"),
                                                   [produce_v(2, "bomb", legacy_gzip_bomb(1_900_000))])[-1]},
    "produce-v2-3-gzip-bombs": {"prepare": lambda b: (create(b, "bomb"), [
        produce_v(2, "bomb", legacy_gzip_bomb(1_900_000) * 3)])[-1]},
    "metadata-4M-empty-names": {"prepare": lambda b: [frame(3, 1, struct.pack(">i", 4_000_000)
                                                            + b"\x00\x00" * 4_000_000)]},
    "header-2M-tagged-fields": {"prepare": lambda b: [_tagged_header(2_000_000)]},
    "8-announced-100MB": {"prepare": lambda b: [struct.pack(">i", 100_000_000) + bytes(55)] * 8,
                          "expect": "held"},
    "1M-pipelined-api-versions": {"prepare": lambda b: [frame(18, 0, b"") * 1_000_000], "expect": "held"},
    "zstd-8M-keyed-compacted": {"prepare": lambda b: (create(b, "compacted", {"cleanup.policy": "compact"}),
                                                      [produce_v(7, "compacted", zstd_keyed_batch(8_000_000))])[-1]},
    "list-offsets-by-time-64MiB": {"prepare": lambda b: (create(b, "big"), fill(b, "big", 64),
                                                         [list_offsets_v1("big", int(time.time() * 1000) + 3_600_000)])[-1]},
    "create-topics-1000-with-2000": {"prepare": lambda b: (_raw(b, create_topics_v0([("pre-a", 1000), ("pre-b", 1000)])),
                                                           [create_topics_v0([("big-create", 1000)])])[-1]},
    "metadata-auto-create-300": {"prepare": lambda b: [metadata_v4([f"auto-{i}" for i in range(300)])]},
    "2000-init-producer-id": {"prepare": lambda b: [frame(22, 0, b"\xff\xff" + struct.pack(">i", 60000), i)
                                                    for i in range(2000)], "one_connection": True},
}


def _tagged_header(n: int) -> bytes:
    tags = b"".join(uvarint(t) + b"\x00" for t in range(n))
    payload = struct.pack(">hhih", 18, 3, 1, 5) + b"stall" + uvarint(n) + tags + b"\x06stall\x041.0\x00"
    return struct.pack(">i", len(payload)) + payload


def _raw(bootstrap: str, data: bytes) -> None:
    port = int(bootstrap.rsplit(":", 1)[1])
    s = connect(port)
    s.sendall(data)
    answered_or_closed(s, 300)
    s.close()


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def run_row(kind: str, name: str, spec: dict) -> dict:
    broker = Broker(kind, default_command(kind))
    broker.start()
    try:
        inputs = spec["prepare"](broker.bootstrap)
        sent = sum(len(x) for x in inputs)
        rss0 = rss_kb(broker.proc.pid)
        pinger = Pinger(broker.port)
        pinger.start()
        t0 = time.monotonic()
        socks = []
        if spec.get("one_connection"):
            s = connect(broker.port)
            s.sendall(b"".join(inputs))
            socks.append(s)
        else:
            for data in inputs:
                s = connect(broker.port)
                s.setblocking(False)
                view = memoryview(data)
                deadline = time.monotonic() + 10
                while view and time.monotonic() < deadline:
                    try:
                        view = view[s.send(view):]
                    except BlockingIOError:
                        select.select([], [s], [], 0.2)
                s.setblocking(True)
                socks.append(s)
        if spec.get("expect") == "held":
            outcome = "held 5 s"
            time.sleep(5)              # bench pacing: keep the input in place while the pinger measures
        elif spec.get("one_connection"):   # every pipelined request must be answered
            outcome = "answered" if _read_n(socks[0], len(inputs)) else "closed"
        else:
            outcome = ",".join(sorted({answered_or_closed(s, 300) for s in socks}))
        elapsed = time.monotonic() - t0
        rss1 = rss_kb(broker.proc.pid)
        pinger.stop.set()
        pinger.join(60)
        for s in socks:
            s.close()
        alive = broker.alive()
        return {"broker": kind, "row": name, "worst_wait_ms": round(pinger.worst_s * 1000, 1),
                "pings": pinger.count, "outcome": outcome, "seconds": round(elapsed, 2),
                "sent_bytes": sent, "rss_growth_mib": round((rss1 - rss0) / 1024, 1), "alive": alive}
    finally:
        broker.stop()


def _read_n(sock: socket.socket, n: int) -> bool:
    sock.settimeout(300)
    for _ in range(n):
        head = _recv(sock, 4)
        if head is None or _recv(sock, struct.unpack(">i", head)[0]) is None:
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", nargs="*", choices=sorted(ROWS), help="rows to run (default all)")
    ap.add_argument("--peer", action="store_true", help="run the rows against Tansu too")
    ap.add_argument("--out", help="JSON output file")
    args = ap.parse_args()
    install_cleanup()
    rows = args.only or list(ROWS)
    kinds = ["odradek"] + (["peer"] if args.peer else [])
    results = []
    print(f"{'row':32} {'broker':8} {'worst wait':>11} {'RSS +MiB':>9} {'sent MiB':>9}  outcome")
    for name in rows:
        for kind in kinds:
            try:
                r = run_row(kind, name, ROWS[name])
            except Exception as e:  # noqa: BLE001 - a failed row is reported, the others still run
                r = {"broker": kind, "row": name, "error": repr(e)}
                print(f"{name:32} {kind:8} failed: {e!r}")
            else:
                flag = "" if r["worst_wait_ms"] <= TARGET_MS and r["alive"] else "  <-- over target" \
                    if r["alive"] else "  <-- BROKER DIED"
                print(f"{name:32} {kind:8} {r['worst_wait_ms']:>8.1f} ms {r['rss_growth_mib']:>9.1f} "
                      f"{r['sent_bytes'] / 2**20:>9.2f}  {r['outcome']} in {r['seconds']} s{flag}")
            results.append(r)
            sys.stdout.flush()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0 if all("error" not in r and r["alive"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
